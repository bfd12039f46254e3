//! Writing deferred jobs: one job's columns with its defaults applied, the batch columns,
//! the insert statements (plain, batch, unique) and the errors they map.

use super::*;
use crate::types::array_or_null;

/// One job as its columns, defaults applied.
pub(super) struct Row {
    pub(super) queue: String,
    pub(super) task: String,
    pub(super) args: RawJson,
    pub(super) priority: i32,
    pub(super) lock: Option<String>,
    pub(super) queueing_lock: Option<String>,
    pub(super) at: Option<SystemTime>,
    pub(super) delay_us: i64,
    pub(super) max_attempts: Option<i32>,
    pub(super) tags: Option<Vec<String>>,
    pub(super) meta: Option<RawJson>,
    pub(super) unique: Option<Unique>,
    pub(super) after: Vec<i64>,
    pub(super) after_finished: Vec<i64>,
    /// The deadline as a time, or ...
    pub(super) expires_at: Option<SystemTime>,
    /// ... in microseconds from the database's now (neither: none).
    pub(super) expires_in_us: Option<i64>,
}

impl Row {
    /// The parameters of `store::JOB_INSERT`.
    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.queue,
            &self.task,
            &self.args,
            &self.priority,
            &self.lock,
            &self.queueing_lock,
            &self.at,
            &self.delay_us,
            &self.max_attempts,
            &self.tags,
            &self.meta,
            &self.expires_at,
            &self.expires_in_us,
        ]
    }

    /// Whether the job waits for others (it is then inserted by `postpone_defer_jobs`).
    pub(super) fn has_deps(&self) -> bool {
        !self.after.is_empty() || !self.after_finished.is_empty()
    }

    /// Inserts a job with dependencies: one statement, so atomic on any client.
    /// Statements run on `client` name the schema of `ns` (the client may be the caller's).
    pub(super) fn insert_after<C: DeferClient + ?Sized>(
        self,
        ns: &Namespace,
        client: &mut C,
    ) -> Result<JobId> {
        let task = self.task.clone();
        let cols = BatchColumns::from_rows(vec![self]);
        let rows = client
            .run_query(
                "deferring a job",
                &ns.qualify(store::JOB_INSERT_AFTER),
                &cols.after_params(),
            )
            .map_err(|e| defer_error(e, cols.queueing_lock[0].as_deref()))?;
        crate::metrics::deferred(&task);
        rows.first().map(|r| JobId(r.get(0))).ok_or_else(|| {
            Error::new(
                ErrorKind::Other,
                "deferring a job: the insert returned no row",
            )
        })
    }

    /// Inserts the job unless its unique key is held (any job: one without `unique` is
    /// inserted, or refused for its queueing lock).
    pub(super) fn insert_unique<C: DeferClient + ?Sized>(
        &self,
        ns: &Namespace,
        client: &mut C,
    ) -> Result<Deferred> {
        let Some(u) = self.unique else {
            let rows = client
                .run_query(
                    "deferring a job",
                    &ns.qualify(store::JOB_INSERT),
                    &self.params(),
                )
                .map_err(|e| defer_error(e, self.queueing_lock.as_deref()))?;
            crate::metrics::deferred(&self.task);
            return rows
                .first()
                .map(|r| Deferred::Inserted(JobId(r.get(0))))
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Other,
                        "deferring a job: the insert returned no row",
                    )
                });
        };
        let scope = u.scope();
        let by_queue = u.keyed_by_queue();
        let period = u.period_us()?;
        let holder = ns.qualify(match u.scope() {
            "w" => store::JOB_UNIQUE_HOLDER_W,
            "r" => store::JOB_UNIQUE_HOLDER_R,
            _ => store::JOB_UNIQUE_HOLDER_S,
        });
        let insert = ns.qualify(store::JOB_INSERT_UNIQUE);
        let p = self.params();
        let mut params: Vec<&(dyn ToSql + Sync)> = p.to_vec();
        params.extend_from_slice(&[&scope, &by_queue, &period]);
        // A conflict that vanished before we looked (the holder finished or was deleted
        // meanwhile) is tried again: a few rounds, each of which sees newer commits.
        for _ in 0..5 {
            let rows = client
                .run_query("deferring a unique job", &insert, &params)
                .map_err(|e| defer_error(e, self.queueing_lock.as_deref()))?;
            let row = rows.first().ok_or_else(|| {
                Error::new(
                    ErrorKind::Other,
                    "deferring a unique job: the insert returned no row",
                )
            })?;
            let id: Option<i64> = row.get(0);
            let key: String = row.get(1);
            if let Some(id) = id {
                crate::metrics::deferred(&self.task);
                return Ok(Deferred::Inserted(JobId(id)));
            }
            let found =
                client.run_query("finding the job that holds a unique key", &holder, &[&key])?;
            if let Some(r) = found.first() {
                return Ok(Deferred::Duplicate(JobId(r.get(0))));
            }
            if let Some(lock) = &self.queueing_lock {
                let found = client.run_query(
                    "finding the job that holds a queueing lock",
                    &ns.qualify(store::JOB_QUEUEING_LOCK_HOLDER),
                    &[lock],
                )?;
                if let Some(r) = found.first() {
                    let id: i64 = r.get(0);
                    return Err(Error::new(
                        ErrorKind::AlreadyEnqueued,
                        format!("deferring a job: job {id} with queueing lock {lock:?} is already waiting (todo); nothing was inserted"),
                    )
                    .set_sqlstate("23505"));
                }
            }
        }
        Err(Error::new(
            ErrorKind::Other,
            "deferring a unique job: its key stayed taken but no job holding it could be read after 5 tries; try again",
        ))
    }

    /// Inserts on `conn`, a connection of an App of namespace `ns`.
    pub(super) fn insert_on(self, ns: &Namespace, conn: &mut Connection) -> Result<JobId> {
        if self.has_deps() {
            return self.insert_after(ns, conn);
        }
        // A job due now, committed by this very statement: its notification goes in a
        // transaction of its own right behind it (same round-trip), which writes nothing and
        // so does not hold the server's notification lock through a WAL flush; concurrent
        // defers then share their flushes. Inside a caller's transaction, or through a
        // transaction pooler, the insert trigger notifies at the caller's commit as before.
        let quiet = self.at.is_none()
            && self.delay_us <= 0
            && !conn.in_transaction()
            && !conn.through_transaction_pooler();
        let rows = if quiet {
            conn.query_cached_then(
                "deferring a job",
                store::JOB_INSERT_QUIET,
                &self.params(),
                store::WAKE_QUEUE,
                &[&self.queue],
            )
        } else {
            conn.query_cached("deferring a job", store::JOB_INSERT, &self.params())
        }
        .map_err(|e| defer_error(e, self.queueing_lock.as_deref()))?;
        crate::metrics::deferred(&self.task);
        Ok(JobId(rows[0].get(0)))
    }
}

/// A duplicate reported by an entry point that returns only an id: an `AlreadyEnqueued`
/// error naming the job that covers it.
pub(super) fn duplicate_error(d: Deferred) -> Result<JobId> {
    match d {
        Deferred::Inserted(id) => Ok(id),
        Deferred::Duplicate(id) => Err(Error::new(
            ErrorKind::AlreadyEnqueued,
            format!("deferring a unique job: job {id} already covers it; nothing was inserted (defer_unique returns that id instead of an error)"),
        )),
    }
}

/// Inserts `jobs` (unique or not) in one transaction through the App's pool, each by its own
/// statement in input order; what each did, in input order.
pub(crate) fn insert_batch_unique(app: &dyn Inserter, jobs: &[NewJob]) -> Result<Vec<Deferred>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut rows = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        j.validate()
            .map_err(|e| e.context(format_args!("job {i} of the batch")))?;
        rows.push(j.row(app.defaults()));
    }
    let mut conn = app.pooled()?;
    let mut tx = conn.transaction()?;
    let mut out = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        out.push(
            r.insert_unique(app.namespace(), &mut tx)
                .map_err(|e| e.context(format_args!("job {i} of the batch")))?,
        );
    }
    tx.commit()?;
    Ok(out)
}

/// Inserts `jobs` in one statement through the App's pool; ids in input order.
pub(crate) fn insert_batch(app: &dyn Inserter, jobs: &[NewJob]) -> Result<Vec<JobId>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let cols = BatchColumns::new(jobs, app.defaults())?;
    let mut conn = app.pooled()?;
    let rows = if cols.edge_job.is_empty() {
        conn.query_cached("deferring jobs", store::JOB_INSERT_BATCH, &cols.params())
    } else {
        conn.query_cached(
            "deferring jobs",
            store::JOB_INSERT_AFTER,
            &cols.after_params(),
        )
    }
    .map_err(|e| defer_error(e, None))?;
    crate::metrics::deferred_tasks(&cols.task);
    Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
}

/// Checks `jobs` as [`insert_batch_in`] would, without a round-trip.
pub(crate) fn check_batch(app: &dyn Inserter, jobs: &[NewJob]) -> Result<()> {
    BatchColumns::new(jobs, app.defaults()).map(drop)
}

/// Inserts `jobs` in one statement with the caller's client; ids in input order.
pub(crate) fn insert_batch_in<C: DeferClient + ?Sized>(
    app: &dyn Inserter,
    client: &mut C,
    jobs: &[NewJob],
) -> Result<Vec<JobId>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let cols = BatchColumns::new(jobs, app.defaults())?;
    let ns = app.namespace();
    let rows = if cols.edge_job.is_empty() {
        client.run_query(
            "deferring jobs",
            &ns.qualify(store::JOB_INSERT_BATCH),
            &cols.params(),
        )
    } else {
        client.run_query(
            "deferring jobs",
            &ns.qualify(store::JOB_INSERT_AFTER),
            &cols.after_params(),
        )
    }
    .map_err(|e| defer_error(e, None))?;
    crate::metrics::deferred_tasks(&cols.task);
    Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
}

/// Turns a unique violation of the queueing-lock index into `AlreadyEnqueued`, and a
/// dependency that does not exist into `NotFound`.
pub(crate) fn defer_error(e: Error, queueing_lock: Option<&str>) -> Error {
    if e.sqlstate() == Some("23503") && e.constraint() == Some(store::DEPENDENCY_CONSTRAINT) {
        return e.set_kind(ErrorKind::NotFound);
    }
    if e.sqlstate() == Some("23505") && e.constraint() == Some(store::QUEUEING_LOCK_INDEX) {
        let msg = match queueing_lock {
            Some(l) => format!(
                "deferring a job: a job with queueing lock {l:?} is already waiting (todo); nothing was inserted"
            ),
            None => "deferring jobs: a job with one of these queueing locks is already waiting (todo); nothing was inserted".to_owned(),
        };
        return Error::new(ErrorKind::AlreadyEnqueued, msg).set_sqlstate("23505");
    }
    e
}

/// Column arrays of a batch insert.
pub(super) struct BatchColumns {
    pub(super) queue: Vec<String>,
    pub(super) task: Vec<String>,
    pub(super) args: Vec<RawJson>,
    pub(super) priority: Vec<i32>,
    pub(super) lock: Vec<Option<String>>,
    pub(super) queueing_lock: Vec<Option<String>>,
    pub(super) at: Vec<Option<SystemTime>>,
    pub(super) delay: Vec<i64>,
    pub(super) max_attempts: Vec<Option<i32>>,
    /// Each job's tags as a JSON array (an array of arrays cannot be ragged).
    pub(super) tags: Vec<Option<RawJson>>,
    pub(super) meta: Vec<Option<RawJson>>,
    /// Each job's deadline as a time, or in microseconds from the database's now.
    pub(super) expires_at: Vec<Option<SystemTime>>,
    pub(super) expires_in: Vec<Option<i64>>,
    /// Dependencies, one entry per (job, dependency): the job's position (1-based), the id
    /// of the job it waits for, and whether any outcome of that job will do.
    pub(super) edge_job: Vec<i32>,
    pub(super) edge_dep: Vec<i64>,
    pub(super) edge_any: Vec<bool>,
}

impl BatchColumns {
    pub(super) fn new(jobs: &[NewJob], defaults: &TaskDefaults) -> Result<BatchColumns> {
        let mut rows = Vec::with_capacity(jobs.len());
        for (i, j) in jobs.iter().enumerate() {
            j.validate()
                .map_err(|e| e.context(format_args!("job {i} of the batch")))?;
            if j.unique.is_some() {
                return Err(Error::invalid(format!(
                    "job {i} of the batch is unique: defer it with defer_batch_unique, which reports the duplicates"
                )));
            }
            rows.push(j.row(defaults));
        }
        Ok(BatchColumns::from_rows(rows))
    }

    pub(super) fn from_rows(rows: Vec<Row>) -> BatchColumns {
        let n = rows.len();
        let mut c = BatchColumns {
            queue: Vec::with_capacity(n),
            task: Vec::with_capacity(n),
            args: Vec::with_capacity(n),
            priority: Vec::with_capacity(n),
            lock: Vec::with_capacity(n),
            queueing_lock: Vec::with_capacity(n),
            at: Vec::with_capacity(n),
            delay: Vec::with_capacity(n),
            max_attempts: Vec::with_capacity(n),
            tags: Vec::with_capacity(n),
            meta: Vec::with_capacity(n),
            expires_at: Vec::with_capacity(n),
            expires_in: Vec::with_capacity(n),
            edge_job: Vec::new(),
            edge_dep: Vec::new(),
            edge_any: Vec::new(),
        };
        for (i, r) in rows.into_iter().enumerate() {
            // Positions past i32::MAX cannot be sent; no batch is that large.
            let pos = i32::try_from(i + 1).unwrap_or(i32::MAX);
            for (deps, any) in [(&r.after, false), (&r.after_finished, true)] {
                for &d in deps {
                    c.edge_job.push(pos);
                    c.edge_dep.push(d);
                    c.edge_any.push(any);
                }
            }
            c.queue.push(r.queue);
            c.task.push(r.task);
            c.args.push(r.args);
            c.priority.push(r.priority);
            c.lock.push(r.lock);
            c.queueing_lock.push(r.queueing_lock);
            c.at.push(r.at);
            c.delay.push(r.delay_us);
            c.max_attempts.push(r.max_attempts);
            c.tags.push(
                r.tags
                    .map(|t| RawJson(serde_json::to_string(&t).unwrap_or_else(|_| "[]".into()))),
            );
            c.meta.push(r.meta);
            c.expires_at.push(r.expires_at);
            c.expires_in.push(r.expires_in_us);
        }
        c
    }

    /// The parameters of `store::JOB_INSERT_BATCH`. A column that no job of the batch sets
    /// goes as a NULL array ([`array_or_null`]): a batch of plain jobs sends 5 arrays
    /// instead of 13.
    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.queue,
            &self.task,
            &self.args,
            &self.priority,
            array_or_null(&self.lock),
            array_or_null(&self.queueing_lock),
            array_or_null(&self.at),
            &self.delay,
            array_or_null(&self.max_attempts),
            array_or_null(&self.tags),
            array_or_null(&self.meta),
            array_or_null(&self.expires_at),
            array_or_null(&self.expires_in),
        ]
    }

    /// The parameters of `store::JOB_INSERT_AFTER`, the unset columns as NULL arrays as in
    /// [`BatchColumns::params`].
    pub(super) fn after_params(&self) -> [&(dyn ToSql + Sync); 16] {
        [
            &self.queue,
            &self.task,
            &self.args,
            &self.priority,
            array_or_null(&self.lock),
            array_or_null(&self.queueing_lock),
            array_or_null(&self.at),
            &self.delay,
            array_or_null(&self.max_attempts),
            array_or_null(&self.tags),
            array_or_null(&self.meta),
            &self.edge_job,
            &self.edge_dep,
            &self.edge_any,
            array_or_null(&self.expires_at),
            array_or_null(&self.expires_in),
        ]
    }
}
