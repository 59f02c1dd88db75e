//! Rebuild when a migration changes: `sqlx::migrate!` embeds `rust/migrations/<engine>/` at
//! compile time but does not tell cargo to watch the folder (sqlx's documented build script).

fn main() {
    println!("cargo:rerun-if-changed=rust/migrations");
}
