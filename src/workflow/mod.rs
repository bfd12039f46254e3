//! Workflows: a named graph of jobs inserted together ([`App::workflow`],
//! [`WorkflowBuilder`]), then inspected, cancelled and retried as a whole
//! ([`Admin::workflow`](crate::Admin::workflow),
//! [`Admin::cancel_workflow`](crate::Admin::cancel_workflow),
//! [`Admin::retry_workflow`](crate::Admin::retry_workflow)).
//!
//! Built on job dependencies (schema version 23): a step is a job deferred `after` (or
//! `after_finished`) the jobs of the steps it names, so the database releases or cancels it
//! in the statement that records its last dependency's outcome, whichever worker finishes
//! what. Membership is kept in a table of its own (`postpone_workflow_jobs`, schema version
//! 28): a job outside a workflow has no row, no column and no index entry there, so nothing
//! here runs on its defer, claim or finish.
//!
//! The builder checks the whole graph before any statement: every step a step names must be
//! a step of this workflow (added to it, or named in it), and the graph must have no cycle.
//! The insert is then one transaction (or the caller's): the workflow row, the steps one
//! layer at a time (a layer's jobs name jobs of earlier layers only, by the ids they just
//! got), and the membership rows. No step can run before the jobs it waits for exist.
//!
//! Cancelling a workflow cancels every waiting member and asks every running one to abort,
//! in one statement; retrying one puts its failed, cancelled and aborted members back in one
//! call of `postpone_requeue`, whose dependency triggers make each retried job wait again for
//! the retried jobs it runs after.

mod admin;

pub(crate) use admin::of_job;
pub use admin::*;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::app::App;
use crate::client_trait::DeferClient;
use crate::error::{Error, ErrorKind, Result};
use crate::insert::{self, NewJob};
use crate::store;
use crate::types::JobId;

/// The id of a workflow: a newtype over the `bigint` key of `postpone_workflows`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct WorkflowId(pub i64);

crate::types::id_impls!(WorkflowId, "workflow");

/// A step of a workflow being built: returned by [`StepBuilder::add`], or made by
/// [`Step::named`] to name a step by its name (also one added later).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Step(StepRef);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum StepRef {
    /// The `index`-th step of the builder numbered `builder`.
    Added { builder: u64, index: usize },
    /// The step given this name ([`StepBuilder::name`]).
    Named(String),
}

impl Step {
    /// The step of the workflow named `name` ([`StepBuilder::name`]), resolved when the
    /// workflow is inserted: a step may name one added after it (an unknown name, or a
    /// cycle, is then refused before anything is inserted).
    pub fn named(name: impl Into<String>) -> Step {
        Step(StepRef::Named(name.into()))
    }
}

/// Numbers the builders of this process, so that a step of one is refused by another.
static BUILDERS: AtomicU64 = AtomicU64::new(1);

/// A workflow being built by [`App::workflow`]: steps, each a job and the steps it runs
/// after, then [`insert`](Self::insert) (or [`insert_in`](Self::insert_in), with the
/// caller's transaction).
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// use postpone::NewJob;
///
/// let mut wf = app.workflow("nightly");
/// let fetch = wf.step(NewJob::new("fetch", &"https://example.com/a.csv")?).add();
/// // Two parsers, each once the fetch has succeeded...
/// let left = wf.step(NewJob::new("parse", &"left")?).after([&fetch]).add();
/// let right = wf.step(NewJob::new("parse", &"right")?.queue("cpu")).after([&fetch]).add();
/// // ...and a report once both have.
/// let report = wf.step(NewJob::new("report", &())?).after(&[left, right]).add();
/// let run = wf.insert()?;
/// println!("workflow {}: report is job {:?}", run.id, run.job(&report));
/// let info = app.admin().workflow(run.id)?;
/// println!("{} of {} finished", info.finished(), info.total);
/// # Ok(())
/// # }
/// ```
#[must_use = "a workflow is inserted only by insert or insert_in"]
pub struct WorkflowBuilder<'a> {
    app: &'a App,
    name: String,
    number: u64,
    steps: Vec<StepSpec>,
}

struct StepSpec {
    name: Option<String>,
    job: NewJob,
    after: Vec<Step>,
    after_finished: Vec<Step>,
}

impl fmt::Debug for WorkflowBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowBuilder")
            .field("name", &self.name)
            .field("steps", &self.steps.len())
            .finish()
    }
}

/// A step being added to a workflow, from [`WorkflowBuilder::step`]; ends with
/// [`add`](Self::add).
#[must_use = "a step joins its workflow only by add"]
pub struct StepBuilder<'w, 'a> {
    workflow: &'w mut WorkflowBuilder<'a>,
    spec: StepSpec,
}

impl fmt::Debug for StepBuilder<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepBuilder")
            .field("name", &self.spec.name)
            .field("task", &self.spec.job.task())
            .finish()
    }
}

/// A workflow as its insert inserted it; from [`WorkflowBuilder::insert`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Workflow {
    /// Its id (for [`Admin::workflow`](crate::Admin::workflow) and the other operations on
    /// a whole workflow).
    pub id: WorkflowId,
    /// The ids of its jobs, in the order their steps were added.
    pub jobs: Vec<JobId>,
    #[serde(skip)]
    number: u64,
    #[serde(skip)]
    names: HashMap<String, usize>,
}

impl Workflow {
    /// The id of the job of `step`, if it is a step of this workflow.
    pub fn job(&self, step: &Step) -> Option<JobId> {
        let index = match &step.0 {
            StepRef::Added { builder, index } if *builder == self.number => *index,
            StepRef::Added { .. } => return None,
            StepRef::Named(n) => *self.names.get(n)?,
        };
        self.jobs.get(index).copied()
    }
}

impl App {
    /// Starts a workflow named `name` (a label for people: names need not be unique): a
    /// graph of jobs inserted together. See [`WorkflowBuilder`] for an example.
    pub fn workflow(&self, name: impl Into<String>) -> WorkflowBuilder<'_> {
        WorkflowBuilder {
            app: self,
            name: name.into(),
            number: BUILDERS.fetch_add(1, Ordering::Relaxed),
            steps: Vec::new(),
        }
    }
}

impl<'a> WorkflowBuilder<'a> {
    /// Starts a step running `job` (with all its options: queue, priority, locks, schedule,
    /// attempts, tags...). The job's own [`NewJob::after`] and [`NewJob::after_finished`]
    /// may name jobs outside the workflow, which must exist when it is inserted.
    pub fn step(&mut self, job: NewJob) -> StepBuilder<'_, 'a> {
        StepBuilder {
            workflow: self,
            spec: StepSpec {
                name: None,
                job,
                after: Vec::new(),
                after_finished: Vec::new(),
            },
        }
    }

    /// The number of steps added so far.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// True when no step was added.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Inserts the workflow and every job of it in one transaction: all, or nothing.
    /// Refused with [`InvalidInput`](ErrorKind::InvalidInput), before any statement, when it
    /// has no step, when a step names a step this workflow does not have (a name no step
    /// was given, or a step of another workflow), when two steps have the same name, when
    /// the steps wait for each other in a cycle, or when a job is invalid. A job outside
    /// the workflow that a step names and that does not exist is
    /// [`NotFound`](ErrorKind::NotFound), and nothing is inserted.
    pub fn insert(self) -> Result<Workflow> {
        let plan = self.plan()?;
        let mut conn = self.app.connection()?;
        let mut tx = conn.transaction()?;
        let run = self.write(plan, &mut tx)?;
        tx.commit()?;
        Ok(run)
    }

    /// Like [`insert`](Self::insert), inside the caller's transaction: the workflow exists
    /// if and only if it commits. Give it a transaction: the insert takes several
    /// statements (one per layer of the graph), and outside one a failure would leave the
    /// layers before it inserted.
    pub fn insert_in<C: DeferClient + ?Sized>(self, client: &mut C) -> Result<Workflow> {
        let plan = self.plan()?;
        self.write(plan, client)
    }

    /// Checks the graph and orders it: the layers of step indexes (each step's steps in
    /// earlier layers), and each step's dependencies as indexes (`after`, `after_finished`).
    fn plan(&self) -> Result<Plan> {
        let what = format!("inserting workflow {:?}", self.name);
        crate::limits::check_name("workflow name", &self.name).map_err(|e| e.context(&what))?;
        if self.steps.is_empty() {
            return Err(Error::invalid(format!(
                "{what}: it has no step; add jobs with step(..).add() first"
            )));
        }
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, s) in self.steps.iter().enumerate() {
            if let Some(n) = &s.name {
                crate::limits::check_name("step name", n)
                    .map_err(|e| e.context(format_args!("{what}: step {}", self.describe(i))))?;
                if let Some(first) = names.insert(n.clone(), i) {
                    return Err(Error::invalid(format!(
                        "{what}: steps {} and {} are both named {n:?}; step names must be unique within a workflow",
                        self.describe(first),
                        self.describe(i)
                    )));
                }
            }
        }
        let resolve = |i: usize, step: &Step| -> Result<usize> {
            match &step.0 {
                StepRef::Added { builder, index }
                    if *builder == self.number && *index < self.steps.len() =>
                {
                    Ok(*index)
                }
                StepRef::Added { .. } => Err(Error::invalid(format!(
                    "{what}: step {} runs after a step of another workflow; a step can only run after steps of its own workflow (or, by id, after jobs already inserted)",
                    self.describe(i)
                ))),
                StepRef::Named(n) => names.get(n).copied().ok_or_else(|| {
                    Error::invalid(format!(
                        "{what}: step {} runs after step {n:?}, which this workflow does not have; name a step with .name({n:?}) or remove the reference",
                        self.describe(i)
                    ))
                }),
            }
        };
        let mut after = Vec::with_capacity(self.steps.len());
        let mut after_finished = Vec::with_capacity(self.steps.len());
        for (i, s) in self.steps.iter().enumerate() {
            let a = s
                .after
                .iter()
                .map(|d| resolve(i, d))
                .collect::<Result<Vec<_>>>()?;
            let f = s
                .after_finished
                .iter()
                .map(|d| resolve(i, d))
                .collect::<Result<Vec<_>>>()?;
            after.push(a);
            after_finished.push(f);
        }
        let deps: Vec<Vec<usize>> = (0..self.steps.len())
            .map(|i| {
                let mut d: Vec<usize> =
                    after[i].iter().chain(&after_finished[i]).copied().collect();
                d.sort_unstable();
                d.dedup();
                d
            })
            .collect();
        let layers = layers(&deps).map_err(|cycle| {
            let path: Vec<String> = cycle.iter().map(|&i| self.describe(i)).collect();
            Error::invalid(format!(
                "{what}: its steps wait for each other in a cycle ({}); a workflow must be a graph without cycles",
                path.join(" runs after ")
            ))
        })?;
        // Every job checked as its insert would, before any statement.
        let jobs: Vec<NewJob> = self.steps.iter().map(|s| s.job.clone()).collect();
        insert::check_batch(self.app, &jobs).map_err(|e| e.context(&what))?;
        Ok(Plan {
            layers,
            after,
            after_finished,
            names,
        })
    }

    /// `2 (task "parse", named "left")`, for errors: its position from 1, its task, its name.
    fn describe(&self, i: usize) -> String {
        let s = &self.steps[i];
        match &s.name {
            Some(n) => format!("{} (task {:?}, named {n:?})", i + 1, s.job.task()),
            None => format!("{} (task {:?})", i + 1, s.job.task()),
        }
    }

    fn write<C: DeferClient + ?Sized>(self, plan: Plan, client: &mut C) -> Result<Workflow> {
        let what = format!("inserting workflow {:?}", self.name);
        let ns = self.app.namespace();
        let rows = client.run_query(&what, &ns.qualify(store::WORKFLOW_INSERT), &[&self.name])?;
        let id = WorkflowId(
            rows.first()
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Other,
                        format!("{what}: the insert returned no row"),
                    )
                })?
                .get(0),
        );
        let mut ids: Vec<Option<JobId>> = vec![None; self.steps.len()];
        let mut specs: Vec<Option<StepSpec>> = self.steps.into_iter().map(Some).collect();
        let mut step_names: Vec<Option<String>> = vec![None; specs.len()];
        for layer in &plan.layers {
            let mut jobs = Vec::with_capacity(layer.len());
            for &i in layer {
                let spec = specs[i].take().expect("each step is in one layer");
                let id_of = |d: &usize| ids[*d].expect("a layer names earlier layers only");
                let a: Vec<JobId> = plan.after[i].iter().map(id_of).collect();
                let f: Vec<JobId> = plan.after_finished[i].iter().map(id_of).collect();
                step_names[i] = spec.name;
                jobs.push(spec.job.after(&a).after_finished(&f));
            }
            let got =
                insert::insert_batch_in(self.app, client, &jobs).map_err(|e| e.context(&what))?;
            for (&i, job) in layer.iter().zip(got) {
                ids[i] = Some(job);
            }
        }
        let jobs: Vec<JobId> = ids
            .into_iter()
            .map(|j| j.expect("every step inserted"))
            .collect();
        let raw: Vec<i64> = jobs.iter().map(|j| j.0).collect();
        client.run_query(
            &what,
            &ns.qualify(store::WORKFLOW_MEMBERS),
            &[&id.0, &raw, &step_names],
        )?;
        log::debug!(
            "workflow {id} ({:?}) inserted: {} jobs",
            self.name,
            jobs.len()
        );
        Ok(Workflow {
            id,
            jobs,
            number: self.number,
            names: plan.names,
        })
    }
}

impl<'w, 'a> StepBuilder<'w, 'a> {
    /// Names the step, so that other steps can name it with [`Step::named`] (also steps
    /// added before it), and views show the name. Unique within the workflow. Defaults to
    /// none.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.spec.name = Some(name.into());
        self
    }

    /// Runs the step only once the jobs of every step of `steps` (`&[a, b]`, `[&a]`, a
    /// `&Vec<Step>`...) have succeeded; if one
    /// ends failed, cancelled or aborted, this step ends `cancelled`, and so do the steps
    /// waiting for it ([`NewJob::after`] semantics). Calls add up. Defaults to none.
    pub fn after<'s>(mut self, steps: impl IntoIterator<Item = &'s Step>) -> Self {
        self.spec.after.extend(steps.into_iter().cloned());
        self
    }

    /// Runs the step once the jobs of every step of `steps` have finished, whatever their
    /// outcome ([`NewJob::after_finished`] semantics). Calls add up. Defaults to none.
    pub fn after_finished<'s>(mut self, steps: impl IntoIterator<Item = &'s Step>) -> Self {
        self.spec.after_finished.extend(steps.into_iter().cloned());
        self
    }

    /// Adds the step to its workflow; returns it, for other steps to run after. Nothing is
    /// checked or inserted yet: [`WorkflowBuilder::insert`] checks the whole graph.
    pub fn add(self) -> Step {
        let index = self.workflow.steps.len();
        self.workflow.steps.push(self.spec);
        Step(StepRef::Added {
            builder: self.workflow.number,
            index,
        })
    }
}

/// The order of an insert: see [`WorkflowBuilder::plan`].
struct Plan {
    layers: Vec<Vec<usize>>,
    after: Vec<Vec<usize>>,
    after_finished: Vec<Vec<usize>>,
    names: HashMap<String, usize>,
}

/// The steps in layers (Kahn's algorithm): the first layer depends on nothing, each later
/// one only on earlier layers; steps keep their order within a layer. `deps[i]` lists the
/// steps step `i` waits for. A cycle is returned as the steps along it, the first repeated
/// at the end.
fn layers(deps: &[Vec<usize>]) -> std::result::Result<Vec<Vec<usize>>, Vec<usize>> {
    let n = deps.len();
    let mut left: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, d) in deps.iter().enumerate() {
        for &j in d {
            dependents[j].push(i);
        }
    }
    let mut out = Vec::new();
    let mut current: Vec<usize> = (0..n).filter(|&i| left[i] == 0).collect();
    let mut placed = 0;
    while !current.is_empty() {
        placed += current.len();
        let mut next = Vec::new();
        for &i in &current {
            for &k in &dependents[i] {
                left[k] -= 1;
                if left[k] == 0 {
                    next.push(k);
                }
            }
        }
        next.sort_unstable();
        out.push(current);
        current = next;
    }
    if placed == n {
        return Ok(out);
    }
    // Every step left waits for at least one other step left: walk back from one until a
    // step repeats.
    let mut seen = vec![usize::MAX; n];
    let mut path = Vec::new();
    let mut i = (0..n).find(|&i| left[i] > 0).expect("a step is left");
    while seen[i] == usize::MAX {
        seen[i] = path.len();
        path.push(i);
        i = *deps[i]
            .iter()
            .find(|&&j| left[j] > 0)
            .expect("a step left waits for a step left");
    }
    let mut cycle = path.split_off(seen[i]);
    cycle.push(i);
    Err(cycle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_order_a_diamond() {
        // 0 -> 1, 0 -> 2, (1, 2) -> 3
        let deps = vec![vec![], vec![0], vec![0], vec![1, 2]];
        assert_eq!(layers(&deps).unwrap(), vec![vec![0], vec![1, 2], vec![3]]);
    }

    #[test]
    fn layers_keep_independent_steps_together() {
        let deps = vec![vec![], vec![], vec![1], vec![]];
        assert_eq!(layers(&deps).unwrap(), vec![vec![0, 1, 3], vec![2]]);
    }

    #[test]
    fn a_cycle_is_returned_along_its_steps() {
        // 0 waits for 2, 2 for 1, 1 for 0; 3 waits for 0.
        let deps = vec![vec![2], vec![0], vec![1], vec![0]];
        let cycle = layers(&deps).unwrap_err();
        assert_eq!(cycle.first(), cycle.last());
        assert_eq!(cycle.len(), 4);
        for w in cycle.windows(2) {
            assert!(deps[w[0]].contains(&w[1]), "{cycle:?}");
        }
    }

    #[test]
    fn a_step_waiting_for_itself_is_a_cycle() {
        assert_eq!(layers(&[vec![0]]).unwrap_err(), vec![0, 0]);
    }
}
