//! A run of decode steps read one event at a time, at any step: what a
//! simulation that lets recorded steps go by in bulk reads
//! (`pipeline/cycles.rs`): the events it simulates and the times of the
//! few it records, without walking the rest.

use super::{
    build, Dim, JobEvent, Leaf, Node, Poly, Program, StepRun, Terms, C_DEPTH, C_TOKENS, J_TOKENS,
};
use crate::orchestrator::Category;

/// The steps of one [`StepRun`]: every step the same list of leaves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Steps<'p> {
    program: &'p Program,
    body: &'p [Node],
}

impl Program {
    /// The steps of `run` (`None`: `run` is not a run of this program's).
    pub(crate) fn steps(&self, run: &StepRun) -> Option<Steps<'_>> {
        match self.nodes.get(run.node)? {
            Node::Run {
                dim: Dim::Tokens,
                body,
            } if body.iter().all(|n| matches!(n, Node::Leaf(_))) => Some(Steps {
                program: self,
                body,
            }),
            _ => None,
        }
    }

    /// The first run of decode steps ([`Program::step_runs`]'s first),
    /// where no event before its end, but for its time, depends on the
    /// number of decode steps the job adds: no run of steps comes before
    /// it, and no size (or how far back a freed block was made) before it
    /// or in its steps has a term in that number. Then the same job with
    /// more steps makes the same events up to the end of any step of this
    /// run that it has, and a simulation of it decides the same up to there
    /// (a generation whose first `generate()` call runs out of memory at
    /// its `k`-th step runs out there at every length that has that step).
    /// `None` where something before depends on it: a cache sized for the
    /// whole generation (a static one), or an earlier run of steps.
    pub fn first_steps_fixed(&self) -> Option<StepRun> {
        let first = self.step_runs().into_iter().next()?;
        let before = self.nodes.get(..first.node)?;
        let Some(Node::Run { body, .. }) = self.nodes.get(first.node) else {
            return None;
        };
        (self.fixed_in_count(before) && self.fixed_in_count(body)).then_some(first)
    }

    /// Whether no event of `nodes` is repeated per decode step added, and
    /// none's size (or how far back its block was made) has a term in the
    /// number of steps added.
    fn fixed_in_count(&self, nodes: &[Node]) -> bool {
        nodes.iter().all(|node| match node {
            Node::Leaf(i) => self
                .leaves
                .get(*i as usize)
                .and_then(|leaf| leaf.attrs.get(build::SIZE_OR_BACK))
                .is_some_and(|second| !second.has_term(|mask| mask & J_TOKENS != 0)),
            Node::Run {
                dim: Dim::Tokens, ..
            } => false,
            Node::Run {
                dim: Dim::Depth,
                body,
            } => self.fixed_in_count(body),
        })
    }
}

impl Poly {
    /// Whether a term whose variables `mask` names (a set of [`C_DEPTH`]
    /// … bits) is not zero where `of(mask)`.
    fn has_term(&self, of: impl Fn(usize) -> bool) -> bool {
        self.c
            .iter()
            .enumerate()
            .any(|(mask, &c)| c != 0 && of(mask))
    }
}

impl Steps<'_> {
    /// The terms of the step numbered `copy` in its run.
    pub(crate) fn terms(&self, copy: u64) -> Terms {
        let copy = i64::try_from(copy).unwrap_or(i64::MAX);
        Terms::of([0, self.program.extra[0], copy, self.program.extra[1]])
    }

    fn leaf(&self, q: u64) -> Option<(u32, &Leaf)> {
        let Some(Node::Leaf(item)) = self.body.get(usize::try_from(q).ok()?) else {
            return None;
        };
        Some((*item, self.program.leaves.get(*item as usize)?))
    }

    /// The `q`-th event of a step at `terms` ([`Steps::terms`]), the
    /// `index`-th of the job: the event the job's stream makes there.
    pub(crate) fn event(&self, q: u64, index: u64, terms: &Terms) -> Option<JobEvent> {
        let (item, leaf) = self.leaf(q)?;
        self.program.event(item, leaf, index, terms)
    }

    /// Whether the `q`-th event is the same on every step of the run but
    /// for its time: its size, or how far back its block was made, does not
    /// change from step to step, and its block is not a cuBLAS workspace
    /// (a simulation issues only a few of those, [`Category::Workspace`]).
    pub(crate) fn fixed(&self, q: u64) -> bool {
        let Some((_, leaf)) = self.leaf(q) else {
            return false;
        };
        let (Some(key), Some(second)) =
            (self.program.key(leaf), leaf.attrs.get(build::SIZE_OR_BACK))
        else {
            return false;
        };
        // A term with the depth copy's variable is zero outside a block's
        // copies, where the steps are.
        let varies = second.has_term(|mask| mask & C_TOKENS != 0 && mask & C_DEPTH == 0);
        key.category != Category::Workspace && !varies
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::EventKind::{Alloc, Free};
    use crate::program::JobRef;
    use std::ops::ControlFlow;

    /// Every event of every step read through [`Steps::event`] is the
    /// event the stream makes there; a block that grows a step is not
    /// fixed, one that does not is.
    #[test]
    fn a_steps_events_are_the_streams() {
        let prefix = [(Alloc, 1 << 20), (Alloc, 4096)];
        let body = [
            (Alloc, 4096, 0),
            (Alloc, 1 << 20, 4096),
            (Free, 2, 0),
            (Free, 2, 0),
        ];
        let program = Program::of_events(&prefix, &body, 12, &[(Free, 40)]);
        let runs = JobRef::Program(&program).step_runs();
        let [run] = runs.as_slice() else {
            panic!("one run of steps: {runs:?}");
        };
        let steps = program.steps(run).expect("the run's steps");
        let mut streamed = Vec::new();
        JobRef::Program(&program).for_each(|e| {
            streamed.push(*e);
            ControlFlow::Continue(())
        });
        for copy in 0..run.copies {
            let terms = steps.terms(copy);
            for q in 0..run.events {
                let index = run.start + copy * run.events + q;
                assert_eq!(
                    steps.event(q, index, &terms).as_ref(),
                    streamed.get(index as usize),
                    "step {copy}, event {q}"
                );
            }
        }
        let fixed: Vec<bool> = (0..run.events).map(|q| steps.fixed(q)).collect();
        assert_eq!(fixed, [true, false, true, true]);
    }

    /// The first steps are fixed in the number of steps where nothing
    /// before their end depends on it (times aside): sizes that grow per
    /// step do not count, a size in the total count does, before the steps
    /// or in them; what comes after the steps does not.
    #[test]
    fn the_first_steps_are_fixed_unless_something_before_their_end_grows_with_the_count() {
        let prefix = [(Alloc, 1 << 20), (Alloc, 4096)];
        let body = [(Alloc, 4096, 512), (Free, 1, 0)];
        let program = Program::of_events(&prefix, &body, 12, &[(Free, 30)]);
        let run = program.first_steps_fixed().expect("fixed steps");
        assert_eq!((run.start, run.events, run.copies), (2, 2, 12));
        // A block after the steps sized by the whole generation changes
        // nothing before their end.
        let mut after = program.clone();
        let last = after.leaves.len() - 1;
        after.leaves[last].attrs[build::SIZE_OR_BACK].add(J_TOKENS, 2);
        assert!(after.first_steps_fixed().is_some());
        // A cache allocated before the steps for the whole generation (a
        // static one), or a step's block sized so, does.
        for leaf in [1, 2] {
            let mut sized = program.clone();
            sized.leaves[leaf].attrs[build::SIZE_OR_BACK].add(J_TOKENS, 4096);
            assert_eq!(sized.first_steps_fixed(), None, "leaf {leaf}");
        }
    }
}
