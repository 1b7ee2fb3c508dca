//! Programs written by hand, for tests of what reads them.

use super::{Dim, EventKind};
use super::{EventKey, FastLeaf, Leaf, Node, Poly, Program, C_TOKENS, J_TOKENS};
use crate::kernels::ArchSet;
use crate::orchestrator::{Category, Phase};

impl Program {
    /// A generation of `prefix` events, `copies` decode steps of `body`
    /// and `suffix` events; each event its kind, its size (an allocation)
    /// or how many events before its block was made (a free), and, in the
    /// body, how much that number grows a step. One event a nanosecond.
    pub(crate) fn of_events(
        prefix: &[(EventKind, i64)],
        body: &[(EventKind, i64, i64)],
        copies: i64,
        suffix: &[(EventKind, i64)],
    ) -> Program {
        let key = |kind| EventKey {
            kind,
            category: Category::Activation,
            phase: Phase::Forward,
            iteration: Some(0),
            op: None,
            layer: None,
            numbers: 0,
            on: ArchSet::ALL,
            per_gpu: None,
        };
        let keys = vec![key(EventKind::Alloc), key(EventKind::Free)];
        let kind_key = |kind| u32::from(kind == EventKind::Free);
        let (p, b) = (prefix.len() as i64, body.len() as i64);
        let mut leaves = Vec::new();
        let mut nodes = Vec::new();
        let mut leaf = |kind, time: [i64; 3], number: [i64; 2]| {
            let mut t = Poly::default();
            t.add(0, time[0]);
            t.add(C_TOKENS, time[1]);
            t.add(J_TOKENS, time[2]);
            let mut n = Poly::default();
            n.add(0, number[0]);
            n.add(C_TOKENS, number[1]);
            leaves.push(Leaf {
                key: kind_key(kind),
                attrs: vec![t, n],
            });
            Node::Leaf(leaves.len() as u32 - 1)
        };
        for (i, &(kind, n)) in prefix.iter().enumerate() {
            nodes.push(leaf(kind, [i as i64, 0, 0], [n, 0]));
        }
        let run = body
            .iter()
            .enumerate()
            .map(|(q, &(kind, n, growth))| leaf(kind, [p + q as i64, b, 0], [n, growth]))
            .collect();
        nodes.push(Node::Run {
            dim: Dim::Tokens,
            body: run,
        });
        for (i, &(kind, n)) in suffix.iter().enumerate() {
            nodes.push(leaf(kind, [p + i as i64, 0, b], [n, 0]));
        }
        let fast = leaves.iter().map(|l| FastLeaf::of(l, &keys)).collect();
        let mut program = Program {
            nodes,
            leaves,
            keys,
            names: Vec::new(),
            extra: [0, 0],
            n_events: 0,
            n_blocks: 0,
            time_range: None,
            iterations: Vec::new(),
            phases: Vec::new(),
            kernels: Vec::new(),
            fast,
        };
        program.count_at([0, copies]);
        program
    }
}
