//! The records that cross the `Store` trait. Instants are epoch ms (UTC) of the store's clock;
//! an empty `org` is the no-organization lane.

/// Job states (API.md "Job states").
pub const PENDING: &str = "pending";
pub const RUNNING: &str = "running";
pub const DONE: &str = "done";
pub const DEAD: &str = "dead";
pub const CANCELED: &str = "canceled";
pub const STATES: [&str; 5] = [PENDING, RUNNING, DONE, DEAD, CANCELED];

/// A job to insert. `payload` is JSON text, already checked.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub org: String,
    pub id: String,
    pub typ: String,
    pub payload: String,
    /// Absolute due instant; `None` with `delay_ms` None means "now".
    pub run_at: Option<i64>,
    pub delay_ms: Option<i64>,
    pub max_depth: Option<i64>,
}

/// One job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub seq: i64,
    pub org: String,
    pub id: String,
    pub typ: String,
    pub payload: String,
    pub state: String,
    pub attempts: i64,
    pub max_attempts: i64,
    pub last_error: Option<String>,
    pub result: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub run_at: i64,
    pub finished_at: Option<i64>,
}

/// A job handed to a worker by a claim, with the lease's fencing token.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub seq: i64,
    /// The fencing token of this lease: every later write is conditional on it.
    pub token: i64,
    pub org: String,
    pub id: String,
    pub typ: String,
    pub payload: String,
    /// 1-based attempt number, counted at claim time.
    pub attempt: i64,
    pub run_at: i64,
}

/// What a claim asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub owner: String,
    pub limit: usize,
    pub ttl_ms: i64,
    pub max_attempts: i64,
    /// A claim that carries no outcomes first looks, with one cheap read, whether any job is
    /// due or any lease expired (the empty poll). False skips that read, e.g. when the last
    /// claim came back full: jobs are likely due, and the claim is one statement less.
    pub probe: bool,
}

/// The end of one attempt, written conditionally on (seq, token).
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The handler returned; `result` is JSON text (or None).
    Done {
        seq: i64,
        token: i64,
        result: Option<String>,
    },
    /// The handler failed; retried after `delay_ms` unless attempts are used up.
    Failed {
        seq: i64,
        token: i64,
        error: String,
        delay_ms: i64,
    },
}

impl Outcome {
    pub fn seq(&self) -> i64 {
        match self {
            Outcome::Done { seq, .. } | Outcome::Failed { seq, .. } => *seq,
        }
    }
}

/// A lease the worker holds: (seq, fencing token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseRef {
    pub seq: i64,
    pub token: i64,
}

/// The answer to one lease renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewStatus {
    /// Still ours, renewed.
    Held,
    /// Still ours and renewed, but `cancel_job` asked for it to stop.
    CancelRequested,
    /// Not ours any more (reclaimed, finished, or the token moved on).
    Lost,
}

/// Which jobs a listing covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListScope {
    /// One lane (`""` = jobs without organization), optionally filtered.
    Lane {
        org: String,
        state: Option<String>,
        typ: Option<String>,
    },
    /// Every lane: no organization first, then organizations in name order.
    All,
}

/// One page request. Jobs with `seq > snapshot` are not listed (they belong to the next listing).
#[derive(Debug, Clone)]
pub struct ListQuery {
    pub scope: ListScope,
    pub snapshot: i64,
    /// Keyset position: list strictly after (org, seq).
    pub after: Option<(String, i64)>,
    pub limit: i64,
}
