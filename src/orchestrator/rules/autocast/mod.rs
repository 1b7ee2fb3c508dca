//! The autocast rules: the forward of a CPU trace, op by op, as CUDA
//! autocast runs it (issue 16; the policy tables are [`crate::autocast`]).
//!
//! Two starting points share this engine ([`Start`]):
//! - a trace recorded under CPU autocast: each op's outputs get the dtype
//!   CUDA autocast gives them ([`dtypes`]), casts CUDA makes and CPU did not
//!   are added and casts CPU made that CUDA does not are dropped
//!   ([`casts`]), parameter casts stay in CUDA's cast cache until the region
//!   exits ([`cache`]), the CPU kernels' own contiguous copies go
//!   ([`cpu_copies`]) and backward follows the forward's dtypes
//!   ([`backward`]);
//! - an fp32 trace (the mixed-precision what-if): the same, as if the
//!   forward of every iteration ran under CUDA autocast.
//!
//! Tensors have no identity in a trace. An op's inputs are matched with the
//! outputs of earlier ops of the same region by element count, the latest
//! first (`Input Dims` of the reader; block size over element size for the
//! maker); an input that matches none came from outside the region
//! (parameters, the batch) and has the dtype the trace shows. This is a
//! guess, checked against PyTorch itself in a Python prototype (not shipped): on the CS336
//! model, GPT-2 and Llama the outputs it makes fp32 are those CUDA autocast
//! makes fp32 on fake CUDA tensors.

mod backward;
mod cache;
mod casts;
mod cpu_copies;
mod dtypes;
mod holders;
mod scaler;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::RuleId;
use crate::analyzer::{Analysis, GradMode, OpSpan, Phase};
use crate::autocast::{policy_of, CastPolicy, Device, Dtype, PolicyVersion};
use crate::diag::Warning;
use crate::units::{Bytes, Nanos};

pub(crate) use scaler::grad_scaler_items;

/// How the orchestrator treats autocast. Build one with
/// [`AutocastConfig::standard`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutocastConfig {
    /// The PyTorch version whose policy applies (a name of
    /// [`crate::autocast::VERSIONS`]).
    pub version: String,
    /// The dtype CUDA autocast runs in; `None`: the one the CPU trace ran in.
    #[serde(default)]
    pub dtype: Option<Dtype>,
    /// An fp16 run with `torch.amp.GradScaler`: its state is added.
    #[serde(default)]
    pub grad_scaler: bool,
    /// Which regions run under CUDA autocast.
    #[serde(default)]
    pub mode: AutocastMode,
    /// Also prepare the mixed-precision what-if's job (an fp32 trace's
    /// forward under CUDA autocast): one more orchestration, so only for the
    /// shells that offer the what-if.
    #[serde(default)]
    pub what_if: bool,
}

/// Which parts of a trace run under CUDA autocast.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutocastMode {
    /// The trace's own `torch.autocast` regions (CPU autocast, translated).
    #[default]
    AsTraced,
    /// The forward of every iteration of an fp32 trace (the what-if).
    Forward,
    /// None: the trace's dtypes as they are.
    Off,
}

impl AutocastConfig {
    /// The newest policy, CUDA in the trace's own dtype, no GradScaler.
    pub fn standard() -> AutocastConfig {
        AutocastConfig {
            version: PolicyVersion::latest().name.to_owned(),
            dtype: None,
            grad_scaler: false,
            mode: AutocastMode::AsTraced,
            what_if: false,
        }
    }

    /// The policy version named by [`AutocastConfig::version`].
    pub fn policy(&self) -> Option<&'static PolicyVersion> {
        PolicyVersion::named(&self.version)
    }
}

impl Default for AutocastConfig {
    fn default() -> AutocastConfig {
        AutocastConfig::standard()
    }
}

/// What the trace's forward ran in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// CPU autocast, to this lower-precision type.
    CpuAutocast(Dtype),
    /// No autocast: fp32 (the what-if).
    Fp32,
}

/// One region CUDA autocast runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub tid: i64,
    pub start: Nanos,
    /// When the cast cache is cleared.
    pub end: Nanos,
    pub grad: GradMode,
    pub start_dtype: Start,
}

/// The regions of a trace recorded under CPU autocast (those in which ops
/// ran in a lower-precision type).
pub(crate) fn trace_regions(analysis: &Analysis) -> Vec<Region> {
    analysis
        .autocast
        .iter()
        .filter_map(|r| {
            Some(Region {
                tid: r.tid,
                start: r.start,
                end: r.end,
                grad: r.grad,
                start_dtype: Start::CpuAutocast(r.lower?),
            })
        })
        .collect()
}

/// The regions of the what-if: the forward of every iteration, as if it ran
/// under autocast (the model and its loss, `with torch.autocast(...)`).
pub(crate) fn forward_regions(analysis: &Analysis) -> Vec<Region> {
    let mut out = Vec::new();
    for it in &analysis.iterations {
        let backward = it.phases.iter().any(|p| p.phase == Phase::Backward);
        for span in it.phases.iter().filter(|p| p.phase == Phase::Forward) {
            let tid = analysis
                .ops
                .iter()
                .find(|o| o.start >= span.start && o.start <= span.end && !o.backward)
                .map_or(0, |o| o.tid);
            // Autograd records when the sequence numbers advance (see
            // `analyzer::autocast`).
            let mut seqs = analysis
                .ops
                .iter()
                .filter(|o| o.tid == tid && o.start >= span.start && o.end <= span.end)
                .filter(|o| !matches!(analysis.name(o.name), "aten::to" | "aten::_to_copy"))
                .filter_map(|o| o.sequence_number);
            let first = seqs.next();
            let recording = seqs.any(|s| Some(s) != first);
            out.push(Region {
                tid,
                start: span.start,
                end: span.end,
                grad: if recording || backward {
                    GradMode::Enabled
                } else {
                    GradMode::NoGrad
                },
                start_dtype: Start::Fp32,
            });
        }
    }
    out
}

/// A block the CUDA run makes that the trace does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddedBlock {
    pub size: Bytes,
    pub alloc: Nanos,
    /// `None`: never freed inside the trace.
    pub free: Option<Nanos>,
    /// The op (index into `Analysis::ops`) that makes it.
    pub op: usize,
    pub rule: RuleId,
    /// The GPU architectures whose kernels make it.
    pub on: crate::kernels::ArchSet,
    /// Sized per GPU (`size` a placeholder).
    pub per_gpu: Option<crate::kernels::PerGpu>,
}

/// What the rules change, in the analysis clock, by analyzer block id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// New size of a captured block.
    pub resized: BTreeMap<usize, (Bytes, RuleId)>,
    /// Captured blocks the CUDA run does not make.
    pub dropped: BTreeMap<usize, RuleId>,
    /// New free time of a captured block.
    pub freed: BTreeMap<usize, (Nanos, RuleId)>,
    pub added: Vec<AddedBlock>,
    /// Captured blocks made only on some GPU architectures (a CPU kernel's
    /// block that one CUDA backend makes too).
    pub kept_on: BTreeMap<usize, (crate::kernels::ArchSet, RuleId)>,
}

impl Plan {
    /// The bytes each rule adds to the captured iterations (negative:
    /// removes): a resized block counts its change, a dropped block its
    /// size, an added block its size; moved frees count 0.
    pub fn bytes(&self, analysis: &Analysis) -> BTreeMap<RuleId, i64> {
        let mut out: BTreeMap<RuleId, i64> = BTreeMap::new();
        let size = |b: usize| analysis.blocks.get(b).map_or(0, |b| signed(b.size));
        for (&b, &(new, rule)) in &self.resized {
            *out.entry(rule).or_default() += signed(new) - size(b);
        }
        for (&b, &rule) in &self.dropped {
            *out.entry(rule).or_default() -= size(b);
        }
        for a in &self.added {
            *out.entry(a.rule).or_default() += signed(a.size);
        }
        for &(_, rule) in self.freed.values() {
            out.entry(rule).or_default();
        }
        out
    }
}

fn signed(b: Bytes) -> i64 {
    i64::try_from(b.get()).unwrap_or(i64::MAX)
}

/// The settings of one run of the engine.
#[derive(Debug, Clone)]
pub(crate) struct Setup<'a> {
    pub version: &'a PolicyVersion,
    /// CUDA autocast's dtype; `None`: the region's own lower type.
    pub target: Option<Dtype>,
    pub regions: Vec<Region>,
}

/// A tensor made inside a region, as the engine follows it.
#[derive(Debug, Clone)]
struct Tensor {
    cpu: Dtype,
    cuda: Dtype,
    /// Its block (the output of the op that made it).
    block: usize,
    /// Every op that read it and may keep it for backward made a CUDA
    /// cast copy of it instead.
    only_copied: bool,
    /// An op made a CUDA cast copy of it.
    copied: bool,
    /// The end of the last op that read it.
    last_read: Option<Nanos>,
}

/// One floating input of an op as the engine sees it.
#[derive(Debug, Clone, Copy)]
struct Input {
    numel: u64,
    cpu: Dtype,
    cuda: Dtype,
    /// The tracked tensor it is, if it was made in the region.
    tensor: Option<usize>,
    /// The parameter it is, if one.
    parameter: Option<ParamKey>,
}

/// A parameter, for the cast cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ParamKey {
    /// One of `Analysis::parameters`.
    Known(usize),
    /// A trace whose parameters are unknown (no backward ran): an fp32
    /// input of a matrix product that the region did not make, in the
    /// layer, with as many elements.
    Untracked(crate::trace::NameId, u64),
}

/// Runs the rules over every region of `setup`.
pub(crate) fn plan(analysis: &Analysis, setup: &Setup) -> Plan {
    let mut plan = Plan::default();
    let under = blocks_by_top_op(analysis);
    let savers = savers(analysis);
    let mut factors: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    let mut any_cpu = false;
    let stacks = holders::Stacks::of(analysis);
    for &region in &setup.regions {
        any_cpu |= matches!(region.start_dtype, Start::CpuAutocast(_));
        let lower_cpu = match region.start_dtype {
            Start::CpuAutocast(d) => d,
            Start::Fp32 => Dtype::F32,
        };
        let target = setup.target.unwrap_or(match region.start_dtype {
            Start::CpuAutocast(d) => d,
            Start::Fp32 => Dtype::Bf16,
        });
        let mut walk = Walk {
            analysis,
            version: setup.version,
            region,
            lower_cpu,
            target,
            tensors: Vec::new(),
            by_numel: BTreeMap::new(),
            cached: BTreeSet::new(),
            plan: &mut plan,
            under: &under,
            savers: &savers,
            factors: &mut factors,
            stacks: &stacks,
        };
        let first = analysis
            .ops
            .partition_point(|o| (o.tid, o.start) < (region.tid, region.start));
        let ops: Vec<usize> = analysis
            .ops
            .iter()
            .enumerate()
            .skip(first)
            .take_while(|(_, o)| o.tid == region.tid && o.start <= region.end)
            .filter(|(_, o)| o.parent.is_none() && !o.backward && o.end <= region.end)
            .map(|(i, _)| i)
            .collect();
        for op in ops {
            walk.op(op);
        }
        walk.finish();
    }
    if any_cpu {
        cpu_copies::rule_cpu_lowp_matmul_copies(analysis, &mut plan);
    }
    backward::rule_backward_dtypes(analysis, &factors, &mut plan);
    plan
}

/// The blocks allocated under each top-level op (an op with no parent).
fn blocks_by_top_op(analysis: &Analysis) -> BTreeMap<usize, Vec<usize>> {
    let mut out: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for block in &analysis.blocks {
        if let Some(top) = top_of(analysis, block.alloc_op) {
            out.entry(top).or_default().push(block.id);
        }
    }
    out
}

/// The forward op (top-level) whose autograd node kept each block: a
/// block freed while a backward node runs was one of the tensors that node
/// saved, and autograd releases them when the node has run
/// (`Node::release_variables` in torch/csrc/autograd/function.h). An op
/// that saved a block read it, which tells apart tensors of one size.
fn savers(analysis: &Analysis) -> BTreeMap<usize, usize> {
    let mut out = BTreeMap::new();
    for block in &analysis.blocks {
        if block.free_phase != Some(Phase::Backward) {
            continue;
        }
        let forward = op_chain(analysis, block.free_op)
            .take_while(|o| o.backward)
            .find_map(|o| o.forward_op);
        if let Some(top) = top_of(analysis, forward) {
            out.insert(block.id, top);
        }
    }
    out
}

/// The outermost op above `op` (itself when it has no parent).
fn top_of(analysis: &Analysis, op: Option<usize>) -> Option<usize> {
    let mut op = op?;
    while let Some(parent) = analysis.ops.get(op).and_then(|o| o.parent) {
        op = parent;
    }
    Some(op)
}

/// `op` and the ops above it, innermost first.
fn op_chain(analysis: &Analysis, from: Option<usize>) -> impl Iterator<Item = &OpSpan> + '_ {
    std::iter::successors(from.and_then(|i| analysis.ops.get(i)), move |o| {
        o.parent.and_then(|p| analysis.ops.get(p))
    })
}

/// The op name without its `aten::` namespace.
fn bare(name: &str) -> &str {
    name.strip_prefix("aten::").unwrap_or(name)
}

/// The engine's state while it walks one region.
struct Walk<'a> {
    analysis: &'a Analysis,
    version: &'a PolicyVersion,
    region: Region,
    /// The type CPU autocast cast down to (fp32 for an fp32 trace).
    lower_cpu: Dtype,
    /// The type CUDA autocast casts down to.
    target: Dtype,
    tensors: Vec<Tensor>,
    /// Tracked tensors by element count, oldest first.
    by_numel: BTreeMap<u64, Vec<usize>>,
    /// Parameters whose cast is in the cache.
    cached: BTreeSet<ParamKey>,
    plan: &'a mut Plan,
    under: &'a BTreeMap<usize, Vec<usize>>,
    /// The op whose backward kept each block ([`savers`]).
    savers: &'a BTreeMap<usize, usize>,
    /// Per top-level op whose outputs changed type: (CPU, CUDA) element sizes.
    factors: &'a mut BTreeMap<usize, (u64, u64)>,
    /// The model's stacks of blocks, for when its code lets go of a tensor.
    stacks: &'a holders::Stacks,
}

impl Walk<'_> {
    /// The tracked tensor an input of `numel` elements (CPU type `cpu`, if
    /// known) is: the latest one of that size and type.
    fn find(&self, numel: u64, cpu: Option<Dtype>) -> Option<usize> {
        self.candidates(numel, cpu).next()
    }

    /// The tracked tensors an input of `numel` elements (CPU type `cpu`, if
    /// known) may be, the latest first.
    fn candidates(&self, numel: u64, cpu: Option<Dtype>) -> impl Iterator<Item = usize> + '_ {
        self.by_numel
            .get(&numel)
            .into_iter()
            .flat_map(|ts| ts.iter().rev().copied())
            .filter(move |&t| cpu.is_none_or(|d| self.tensors.get(t).is_some_and(|x| x.cpu == d)))
    }

    /// The tensor an input of `op` is: among those of its size and type,
    /// the latest one that `op`'s backward kept (and no other input of `op`
    /// already is), else the latest one.
    fn find_read_by(
        &self,
        op: usize,
        numel: u64,
        cpu: Option<Dtype>,
        taken: &[usize],
    ) -> Option<usize> {
        let saved = self.candidates(numel, cpu).find(|&t| {
            !taken.contains(&t)
                && self
                    .tensors
                    .get(t)
                    .is_some_and(|x| self.savers.get(&x.block) == Some(&op))
        });
        saved.or_else(|| self.find(numel, cpu))
    }

    /// The parameter an input of `numel` elements of `op` (not made in the
    /// region) is: one of the op's layer with as many elements. Without
    /// known parameters (a trace with no backward), an fp32 input of a
    /// lower-precision op in a layer stands for one: a guess, until the
    /// parameters read by the forward are known.
    fn parameter(&self, op: &OpSpan, numel: u64, dtype: Option<Dtype>) -> Option<ParamKey> {
        let layer = op.layer?;
        if self.analysis.parameters.is_empty() {
            let lower_op = policy_of(self.version, Device::Cuda, self.analysis.name(op.name))
                == Some(CastPolicy::Lower);
            return (lower_op && dtype.is_none_or(|d| d == Dtype::F32))
                .then_some(ParamKey::Untracked(layer, numel));
        }
        self.analysis
            .parameters
            .iter()
            .position(|p| p.numel == numel && p.layer == Some(layer))
            .map(ParamKey::Known)
    }

    /// The floating inputs of `op`. A tensor-list element has no recorded
    /// type: under an op CPU autocast ran in lower precision (`cpu_lower`),
    /// it was fp32 when CPU autocast copied as many elements inside the op
    /// (`cpu_casts`) and in the lower type otherwise; elsewhere it has the
    /// type of the tensor it matches.
    fn inputs(
        &self,
        index: usize,
        op: &OpSpan,
        cpu_casts: &[usize],
        cpu_lower: bool,
    ) -> Vec<Input> {
        let cast_numels: Vec<u64> = cpu_casts
            .iter()
            .filter_map(|&b| self.analysis.blocks.get(b))
            .map(|b| b.size.get() / self.lower_cpu.size().unwrap_or(2))
            .collect();
        let mut out = Vec::new();
        let mut taken = Vec::new();
        for arg in self.analysis.inputs_of(op) {
            if arg.dtype.is_some_and(|d| !d.is_castable()) {
                continue;
            }
            let dtype = match arg.dtype {
                None if arg.in_list && cpu_lower && self.lower_cpu.is_lower() => {
                    Some(if cast_numels.contains(&arg.numel) {
                        Dtype::F32
                    } else {
                        self.lower_cpu
                    })
                }
                other => other,
            };
            let arg = crate::trace::TensorInput { dtype, ..*arg };
            let arg = &arg;
            let tensor = self.find_read_by(index, arg.numel, arg.dtype, &taken);
            taken.extend(tensor);
            let parameter = match tensor {
                Some(_) => None,
                None => self.parameter(op, arg.numel, arg.dtype),
            };
            let tracked = tensor.and_then(|t| self.tensors.get(t));
            let Some(cpu) = arg
                .dtype
                .or_else(|| tracked.map(|t| t.cpu))
                .or_else(|| parameter.map(|_| Dtype::F32))
                .or((!arg.in_list).then_some(self.lower_cpu))
            else {
                continue;
            };
            let cuda = tracked.map_or(cpu, |t| t.cuda);
            out.push(Input {
                numel: arg.numel,
                cpu,
                cuda,
                tensor,
                parameter,
            });
        }
        out
    }

    /// One top-level op of the region.
    fn op(&mut self, index: usize) {
        let analysis = self.analysis;
        let Some(op) = analysis.ops.get(index) else {
            return;
        };
        let name = analysis.name(op.name);
        let cuda_policy = policy_of(self.version, Device::Cuda, name);
        let cpu_policy = match self.region.start_dtype {
            Start::CpuAutocast(_) => dtypes::cpu_policy(analysis, self.version, index),
            Start::Fp32 => None,
        };
        let blocks = self.under.get(&index).cloned().unwrap_or_default();
        let cpu_autocast = matches!(self.region.start_dtype, Start::CpuAutocast(_));
        let (cpu_casts, outputs) = dtypes::split_blocks(
            analysis,
            cpu_autocast.then_some(self.version),
            &self.plan.dropped,
            op,
            &blocks,
        );
        let inputs = self.inputs(index, op, &cpu_casts, cpu_policy == Some(CastPolicy::Lower));
        let cpu_in: Vec<Dtype> = inputs.iter().map(|i| i.cpu).collect();
        let cuda_in: Vec<Dtype> = inputs.iter().map(|i| i.cuda).collect();
        let cpu_out = dtypes::output_dtype(cpu_policy, &cpu_in, self.lower_cpu);
        let cuda_out = dtypes::output_dtype(cuda_policy, &cuda_in, self.target);
        let outputs = dtypes::values_only(analysis, op, outputs, cpu_out);
        casts::input_casts(self, index, cuda_policy, &inputs, cpu_casts);
        let keeps = !casts::keeps_nothing(name, inputs.len());
        self.read(&inputs, cuda_policy, keeps, op.end);
        dtypes::outputs(self, index, cuda_policy, cpu_out, cuda_out, &outputs);
    }

    /// Marks the inputs read by an op ending at `end`, whether CUDA read
    /// each through a cast copy, and whether autograd may keep what the op
    /// read (`keeps`; see [`casts::keeps_nothing`]).
    fn read(&mut self, inputs: &[Input], policy: Option<CastPolicy>, keeps: bool, end: Nanos) {
        let target = self.target;
        for input in inputs {
            let Some(t) = input.tensor.and_then(|t| self.tensors.get_mut(t)) else {
                continue;
            };
            let copied = casts::cuda_cast_to(policy, input.cuda, &[input.cuda], target).is_some();
            t.only_copied &= copied || !keeps;
            t.copied |= copied;
            t.last_read = Some(end);
        }
    }

    /// Starts following an output of `maker`.
    fn track(&mut self, block: usize, numel: u64, cpu: Dtype, cuda: Dtype) {
        let t = self.tensors.len();
        self.tensors.push(Tensor {
            cpu,
            cuda,
            block,
            only_copied: true,
            copied: false,
            last_read: None,
        });
        self.by_numel.entry(numel).or_default().push(t);
    }

    /// After the region: see [`casts::saved_copies`].
    fn finish(&mut self) {
        casts::saved_copies(self);
    }
}

/// The changes of the autocast rules `config` asks for (none when the trace
/// has no region to run under CUDA autocast).
pub(crate) fn changes(
    analysis: &Analysis,
    config: &AutocastConfig,
    warnings: &mut Vec<Warning>,
) -> Plan {
    let regions = match config.mode {
        AutocastMode::Off => return Plan::default(),
        AutocastMode::AsTraced => {
            let disabled = analysis
                .autocast
                .iter()
                .filter(|r| r.lower.is_none())
                .count();
            if disabled > 0 {
                warnings.push(Warning::new(
                    "autocast_region_without_16_bit_ops",
                    format!("{disabled} torch.autocast regions ran no op in bf16 or fp16 on the CPU (autocast was disabled there, or asked for the CUDA device on a machine without one), so they are estimated in fp32 as traced; the mixed-precision what-if estimates them under CUDA autocast"),
                ));
            }
            trace_regions(analysis)
        }
        AutocastMode::Forward => forward_regions(analysis),
    };
    if regions.is_empty() {
        return Plan::default();
    }
    let version = config.policy().unwrap_or_else(|| {
        warnings.push(Warning::new(
            "autocast_version_unknown",
            format!(
                "no autocast policy is known for PyTorch {:?}; the policy of PyTorch {} is used (known: {})",
                config.version,
                PolicyVersion::latest().torch,
                crate::autocast::VERSIONS.iter().map(|v| v.name).collect::<Vec<_>>().join(", ")
            ),
        ));
        PolicyVersion::latest()
    });
    let setup = Setup {
        version,
        target: config.dtype.filter(|d| d.is_lower()),
        regions,
    };
    let plan = plan(analysis, &setup);
    if config.mode == AutocastMode::AsTraced {
        warnings.push(Warning::new(
            "autocast_translated",
            format!(
                "{} torch.autocast regions were recorded under CPU autocast and are estimated as CUDA autocast (PyTorch {} policy) runs them: {} outputs change type, {} input copies are added and {} dropped, {} parameter copies are kept in the cast cache",
                setup.regions.len(),
                version.torch,
                plan.resized.len(),
                plan.added.iter().filter(|a| a.rule == RuleId::AutocastInputCasts).count(),
                plan.dropped.len(),
                plan.freed.values().filter(|f| f.1 == RuleId::AutocastCastCache).count()
                    + plan.added.iter().filter(|a| a.rule == RuleId::AutocastCastCache).count(),
            ),
        ));
    }
    plan
}
