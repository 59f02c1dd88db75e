//! The records that cross the store's traits (`store::QueueStore`, `store::JournalStore`).
//! Instants are epoch ms (UTC) of the store's clock; an empty `org` is the no-organization
//! lane.

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

/// When a job of a batch is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// At the store's clock when the batch is written.
    Now,
    /// At this instant (epoch ms UTC).
    At(i64),
    /// This many ms after the store's clock when the batch is written.
    After(i64),
}

impl Due {
    pub fn of(run_at: Option<i64>, delay_ms: Option<i64>) -> Due {
        match (run_at, delay_ms) {
            (Some(r), _) => Due::At(r),
            (None, Some(d)) => Due::After(d),
            (None, None) => Due::Now,
        }
    }

    /// The due instant, given the store's clock `now`.
    pub fn at(self, now: i64) -> i64 {
        match self {
            Due::Now => now,
            Due::At(r) => r,
            Due::After(d) => now.saturating_add(d),
        }
    }
}

/// One job of a `JobBatch`, borrowed from it.
#[derive(Debug, Clone, Copy)]
pub struct JobRef<'a> {
    pub org: &'a str,
    pub id: &'a str,
    pub typ: &'a str,
    /// JSON text, already checked.
    pub payload: &'a str,
    pub due: Due,
}

#[derive(Debug, Clone, Copy)]
struct Packed {
    /// Where the job's id starts in `text`; its payload follows it, up to the next job's id.
    start: usize,
    id_len: u32,
    org: u32,
    typ: u32,
    due: Due,
}

/// The jobs of one enqueue, packed: ids and payloads back to back in one buffer,
/// organizations and types interned. A 30,000-job batch of ~64-byte payloads takes about the
/// JSON's size plus 40 bytes a job, instead of four heap strings a job. It also keeps what
/// every engine needs besides the rows: each organization's earliest due instant and the
/// smallest `max_depth` asked for.
#[derive(Debug, Default, Clone)]
pub struct JobBatch {
    text: String,
    jobs: Vec<Packed>,
    orgs: Interned,
    types: Interned,
    /// Per organization (index into `orgs`): earliest absolute `run_at`, smallest delay,
    /// whether some job is due now, smallest `max_depth`.
    lanes: Vec<LaneSummary>,
}

/// What one enqueue asks of one organization's lane.
#[derive(Debug, Clone, Copy, Default)]
pub struct LaneSummary {
    /// The earliest absolute `run_at` among its jobs.
    pub min_at: Option<i64>,
    /// The smallest delay among its relative jobs (a job due now counts as delay 0).
    pub min_after: Option<i64>,
    /// The smallest `max_depth` asked for.
    pub max_depth: Option<i64>,
}

/// Each organization of `batches` (parts of one batch) with what they ask of its lane
/// together, in name order.
pub fn lanes_of<'a>(
    batches: impl IntoIterator<Item = &'a JobBatch>,
) -> Vec<(&'a str, LaneSummary)> {
    let mut all: std::collections::BTreeMap<&'a str, LaneSummary> = Default::default();
    for b in batches {
        for (org, lane) in b.orgs.names.iter().zip(&b.lanes) {
            all.entry(org.as_str()).or_default().merge(lane);
        }
    }
    all.into_iter().collect()
}

/// Each (organization, job type) of `batches` (parts of one batch) with when its jobs are due,
/// in (organization, type) name order (`JobBatch::type_lanes`).
pub fn type_lanes_of<'a>(
    batches: impl IntoIterator<Item = &'a JobBatch>,
) -> Vec<(&'a str, &'a str, LaneSummary)> {
    let mut all: std::collections::BTreeMap<(&'a str, &'a str), LaneSummary> = Default::default();
    for b in batches {
        for p in &b.jobs {
            let key = (
                b.orgs.names[p.org as usize].as_str(),
                b.types.names[p.typ as usize].as_str(),
            );
            all.entry(key).or_default().add_due(p.due);
        }
    }
    all.into_iter().map(|((o, t), l)| (o, t, l)).collect()
}

impl LaneSummary {
    /// Count a job due `due` in.
    fn add_due(&mut self, due: Due) {
        match due {
            Due::At(r) => self.min_at = Some(self.min_at.map_or(r, |a| a.min(r))),
            Due::Now => self.min_after = Some(self.min_after.map_or(0, |a| a.min(0))),
            Due::After(d) => self.min_after = Some(self.min_after.map_or(d, |a| a.min(d))),
        }
    }

    /// What this lane and `other` ask together.
    pub fn merge(&mut self, other: &LaneSummary) {
        fn min(a: Option<i64>, b: Option<i64>) -> Option<i64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, None) => a,
                (None, b) => b,
            }
        }
        self.min_at = min(self.min_at, other.min_at);
        self.min_after = min(self.min_after, other.min_after);
        self.max_depth = min(self.max_depth, other.max_depth);
    }

    /// The earliest due instant, given the store's clock `now`.
    pub fn earliest(&self, now: i64) -> i64 {
        let rel = self.min_after.map(|d| now.saturating_add(d));
        match (self.min_at, rel) {
            (Some(a), Some(r)) => a.min(r),
            (Some(a), None) => a,
            (None, Some(r)) => r,
            (None, None) => now,
        }
    }
}

/// Names interned in order of first use: a batch's organizations or types.
#[derive(Debug, Default, Clone)]
struct Interned {
    names: Vec<String>,
    /// name -> index, kept once there are more than `SCAN_MAX` names (a batch over many
    /// organizations would otherwise scan them all for every job).
    index: std::collections::HashMap<String, u32>,
}

impl Interned {
    const SCAN_MAX: usize = 16;

    fn get(&mut self, s: &str) -> u32 {
        // Batches usually hold a handful of names, and the last one usually repeats.
        if self.names.len() <= Self::SCAN_MAX {
            if let Some(i) = self.names.iter().rposition(|t| t == s) {
                return i as u32;
            }
        } else if self.names.last().is_some_and(|t| t == s) {
            return (self.names.len() - 1) as u32;
        } else if let Some(i) = self.index.get(s) {
            return *i;
        }
        self.names.push(s.to_string());
        if self.names.len() > Self::SCAN_MAX {
            if self.index.is_empty() {
                for (i, n) in self.names.iter().enumerate() {
                    self.index.insert(n.clone(), i as u32);
                }
            } else {
                self.index
                    .insert(s.to_string(), (self.names.len() - 1) as u32);
            }
        }
        (self.names.len() - 1) as u32
    }
}

impl JobBatch {
    /// An empty batch with room for `jobs` jobs and `text` bytes of ids and payloads.
    pub fn with_capacity(jobs: usize, text: usize) -> Self {
        JobBatch {
            text: String::with_capacity(text),
            jobs: Vec::with_capacity(jobs),
            ..Default::default()
        }
    }

    /// Add a job whose payload `write_payload` appends (as JSON text) to the buffer it is
    /// given. When it fails, the batch is left as it was.
    pub fn push_with<E>(
        &mut self,
        org: &str,
        id: &str,
        typ: &str,
        due: Due,
        max_depth: Option<i64>,
        write_payload: impl FnOnce(&mut String) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let start = self.text.len();
        self.text.push_str(id);
        if let Err(e) = write_payload(&mut self.text) {
            self.text.truncate(start);
            return Err(e);
        }
        let org_i = self.orgs.get(org);
        if org_i as usize == self.lanes.len() {
            self.lanes.push(LaneSummary::default());
        }
        let lane = &mut self.lanes[org_i as usize];
        lane.add_due(due);
        if let Some(m) = max_depth {
            lane.max_depth = Some(lane.max_depth.map_or(m, |a| a.min(m)));
        }
        let typ = self.types.get(typ);
        self.jobs.push(Packed {
            start,
            id_len: id.len() as u32,
            org: org_i,
            typ,
            due,
        });
        Ok(())
    }

    /// Add a job.
    pub fn push(
        &mut self,
        org: &str,
        id: &str,
        typ: &str,
        payload: &str,
        due: Due,
        max_depth: Option<i64>,
    ) {
        let _ = self.push_with::<()>(org, id, typ, due, max_depth, |t| {
            t.push_str(payload);
            Ok(())
        });
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The `i`th job.
    pub fn get(&self, i: usize) -> JobRef<'_> {
        let p = &self.jobs[i];
        let id_end = p.start + p.id_len as usize;
        let end = self.jobs.get(i + 1).map_or(self.text.len(), |n| n.start);
        JobRef {
            org: &self.orgs.names[p.org as usize],
            id: &self.text[p.start..id_end],
            typ: &self.types.names[p.typ as usize],
            payload: &self.text[id_end..end],
            due: p.due,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = JobRef<'_>> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }

    /// The bytes of text (org, id, type, payload) of job `i`.
    pub fn text_len(&self, i: usize) -> usize {
        let j = self.get(i);
        j.org.len() + j.id.len() + j.typ.len() + j.payload.len()
    }

    /// Each organization of the batch with what the batch asks of its lane, in name order.
    pub fn lanes(&self) -> Vec<(&str, LaneSummary)> {
        lanes_of([self])
    }

    /// Each (organization, job type) of the batch with when its jobs are due (the lane rows a
    /// claim reads are per organization and type), in (organization, type) name order;
    /// `max_depth` is not set (it is the organization's).
    pub fn type_lanes(&self) -> Vec<(&str, &str, LaneSummary)> {
        type_lanes_of([self])
    }

    /// Make room for `jobs` more jobs of about `text_per_job` bytes of id and payload each.
    pub fn reserve(&mut self, jobs: usize, text_per_job: usize) {
        self.jobs.reserve(jobs);
        self.text.reserve(jobs.saturating_mul(text_per_job));
    }

    /// Bytes of ids and payloads held.
    pub fn text_bytes(&self) -> usize {
        self.text.len()
    }

    /// Add every job of `other` after this batch's (its payloads as they are, its lanes'
    /// `max_depth`s kept).
    pub fn append(&mut self, other: &JobBatch) {
        for j in other.iter() {
            self.push(j.org, j.id, j.typ, j.payload, j.due, None);
        }
        for (org, lane) in other.orgs.names.iter().zip(&other.lanes) {
            let i = self.orgs.get(org) as usize;
            self.lanes[i].merge(lane);
        }
    }

    /// Whether some job asks for a `max_depth`.
    pub fn has_limits(&self) -> bool {
        self.lanes.iter().any(|l| l.max_depth.is_some())
    }
}

impl From<&[NewJob]> for JobBatch {
    fn from(jobs: &[NewJob]) -> Self {
        let text = jobs.iter().map(|j| j.id.len() + j.payload.len()).sum();
        let mut b = JobBatch::with_capacity(jobs.len(), text);
        for j in jobs {
            b.push(
                &j.org,
                &j.id,
                &j.typ,
                &j.payload,
                Due::of(j.run_at, j.delay_ms),
                j.max_depth,
            );
        }
        b
    }
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
    /// The job types the worker has handlers for: only jobs of these types are claimed (lanes
    /// in turn among them); a job of another type stays pending for a worker that has its
    /// handler. There is no catch-all: empty claims nothing.
    pub types: Vec<String>,
    /// A claim that carries no outcomes first looks, with one cheap read, whether any job is
    /// due or any lease expired (the empty poll). False skips that read, e.g. when the last
    /// claim came back full: jobs are likely due, and the claim is one statement less.
    pub probe: bool,
    /// At most this many jobs an organization (0: no cap; the batch is split among the
    /// lanes in turn, a quantum at a time: `store::queue::CLAIM_QUANTUM`; a capped claim takes
    /// one pass over up to `limit` organizations). A claim sent while another claim of the same worker is in flight
    /// asks 1: the lanes that claim holds are skipped, and uncapped, the few lanes left would
    /// split the whole batch.
    pub per_org: usize,
    /// Wait for lanes that a claim in flight holds instead of skipping them (Postgres; the
    /// other engines take one claim at a time and ignore it): over one lane or a few, a
    /// second claim in flight then runs right behind the first one and takes the next jobs
    /// of the same lanes (migration 0011). Uncapped (`per_org` is not read).
    pub wait_lanes: bool,
}

/// The end of one attempt, written conditionally on (seq, token). `org` is the job's
/// organization (part of the Postgres key).
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The handler returned; `result` is JSON text (or None).
    Done {
        seq: i64,
        token: i64,
        org: String,
        result: Option<String>,
    },
    /// The handler failed; retried after `delay_ms` unless attempts are used up.
    Failed {
        seq: i64,
        token: i64,
        org: String,
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

    /// The attempt it is the outcome of: (seq, fencing token).
    pub fn attempt(&self) -> (i64, i64) {
        match self {
            Outcome::Done { seq, token, .. } | Outcome::Failed { seq, token, .. } => (*seq, *token),
        }
    }
}

/// A lease the worker holds: (seq, fencing token), and the job's organization.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseRef {
    pub seq: i64,
    pub token: i64,
    pub org: String,
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

/// Counts of one organization's latest jobs (`QueueStore::count_jobs`): bounded, so a figure
/// is exact only when `scanned` is below the scan bound.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobCounts {
    /// (state, jobs) among the jobs examined, in state name order.
    pub states: Vec<(String, i64)>,
    /// Jobs examined: the organization's latest, at most the scan bound.
    pub scanned: i64,
    /// (minute, state, jobs) of the examined jobs that finished at or after `since_ms`:
    /// minute 0 starts at `since_ms`.
    pub finished: Vec<(i64, String, i64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_keeps_each_jobs_organization_and_type_over_many_names() {
        // More names than `Interned::SCAN_MAX`, repeated out of order.
        let mut b = JobBatch::default();
        for i in 0..200 {
            let org = format!("org{}", (i * 7) % 50);
            let typ = format!("t{}", i % 3);
            b.push(&org, &format!("id{i}"), &typ, "{}", Due::Now, None);
        }
        for (i, j) in b.iter().enumerate() {
            assert_eq!(j.org, format!("org{}", (i * 7) % 50));
            assert_eq!(j.typ, format!("t{}", i % 3));
            assert_eq!(j.id, format!("id{i}"));
        }
        let lanes = b.lanes();
        assert_eq!(lanes.len(), 50);
        assert!(lanes.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn appended_parts_are_the_batch_they_were_cut_from() {
        let mut whole = JobBatch::default();
        let mut parts = vec![JobBatch::default(), JobBatch::default()];
        for i in 0..40 {
            let (org, due, depth) = (
                format!("o{}", i % 3),
                [Due::Now, Due::At(5 + i), Due::After(7)][i as usize % 3],
                (i == 33).then_some(2),
            );
            let payload = format!("{{\"i\":{i}}}");
            whole.push(&org, &format!("{i}"), "t", &payload, due, depth);
            parts[(i / 20) as usize].push(&org, &format!("{i}"), "t", &payload, due, depth);
        }
        let mut joined = JobBatch::default();
        for p in &parts {
            joined.append(p);
        }
        let rows = |b: &JobBatch| {
            b.iter()
                .map(|j| {
                    (
                        j.org.to_string(),
                        j.id.to_string(),
                        j.payload.to_string(),
                        j.due,
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(rows(&joined), rows(&whole));
        let lanes = |b: &JobBatch| {
            b.lanes()
                .iter()
                .map(|(o, l)| (o.to_string(), l.min_at, l.min_after, l.max_depth))
                .collect::<Vec<_>>()
        };
        assert_eq!(lanes(&joined), lanes(&whole));
        assert!(joined.has_limits());
    }
}
