//! Which updates each tensor receives, and the clock of the merges.
//!
//! The plan holds the adapters' factors as read and, per target tensor, the list of updates in
//! the order they add up; no delta is formed here. A backend's `load` asks for the terms of the
//! one tensor it is loading and merges them ([`crate::backend::Backend::merge_lora`]), so the
//! work and memory of a merge are those of one tensor, on whichever device holds it.

use super::keys::Module;
use super::Lora;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// One update of one tensor: rows `row0 .. row0 + rows` of `module`'s delta (a fused q|k|v module
/// gives its q, k and v rows to three tensors), times the adapter's `scale`.
#[derive(Clone, Copy, Debug)]
pub struct Term<'a> {
    pub module: &'a Module,
    pub row0: usize,
    pub scale: f32,
}

/// Every adapter attached to a checkpoint and the updates of each tensor.
#[derive(Debug, Default)]
pub struct Plan {
    adapters: Vec<Lora>,
    /// Full tensor name → (adapter, module, first row), in the order the updates add up.
    by_tensor: BTreeMap<String, Vec<(usize, usize, usize)>>,
    /// Time spent merging, over every load (streamed blocks merge at each fetch).
    pub clock: MergeClock,
    /// Seconds reading and checking the adapters' files (set by whoever read them).
    pub read_s: f64,
    /// [`Plan::scratch_bytes`] is at least this: a plan made before the adapters are chosen
    /// (the server's per-request LoRAs) holds the largest merge any choice can make
    /// ([`Plan::scratch_bound`]).
    pub scratch_floor: usize,
}

impl Plan {
    pub fn new(adapters: Vec<Lora>) -> Plan {
        let mut by_tensor: BTreeMap<String, Vec<(usize, usize, usize)>> = BTreeMap::new();
        for (li, l) in adapters.iter().enumerate() {
            for (mi, m) in l.modules.iter().enumerate() {
                let mut row0 = 0;
                for (name, shape) in &m.targets {
                    by_tensor.entry(name.clone()).or_default().push((li, mi, row0));
                    row0 += shape.first().copied().unwrap_or(1);
                }
            }
        }
        Plan { adapters, by_tensor, clock: MergeClock::default(), read_s: 0.0, scratch_floor: 0 }
    }

    pub fn adapters(&self) -> &[Lora] {
        &self.adapters
    }

    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    /// The tensors (full names) some adapter updates.
    pub fn tensors(&self) -> impl Iterator<Item = &str> {
        self.by_tensor.keys().map(String::as_str)
    }

    /// The updates of tensor `name` (full name), in the order they add up; empty if none.
    pub fn terms(&self, name: &str) -> Vec<Term<'_>> {
        self.by_tensor.get(name).map_or(vec![], |v| {
            v.iter().map(|&(li, mi, row0)| Term { module: &self.adapters[li].modules[mi], row0, scale: self.adapters[li].spec.scale }).collect()
        })
    }

    /// The most device memory one tensor's merge takes besides the tensor (bytes): every
    /// update's operands ([`super::merge::operand_bytes`]: the GPU merge holds them all at once)
    /// and, with several updates, the fp32 sum. Tensors merge one after another, each freeing
    /// its scratch (stream-ordered) before the next takes it, so the largest is the peak. 0
    /// without adapters.
    pub fn scratch_bytes(&self) -> usize {
        self.by_tensor
            .keys()
            .map(|name| {
                let terms = self.terms(name);
                let sum = if terms.len() > 1 { numel(&terms, name) * 4 } else { 0 };
                sum + self.operand_bytes(name)
            })
            .max()
            .unwrap_or(0)
            .max(self.scratch_floor)
    }

    /// The operands of tensor `name`'s updates on the device ([`super::merge::operand_bytes`]).
    fn operand_bytes(&self, name: &str) -> usize {
        let terms = self.terms(name);
        let n = numel(&terms, name);
        terms.iter().map(|t| super::merge::operand_bytes(t.module, n)).sum()
    }

    /// The largest [`Plan::scratch_bytes`] of any `most` of `adapters` (each at most once, in
    /// any order, at any scale): per tensor, the fp32 sum and the operands of the `most`
    /// adapters whose updates of it are largest.
    pub fn scratch_bound(adapters: &[Lora], most: usize) -> usize {
        let mut by_tensor: BTreeMap<String, (usize, Vec<usize>)> = BTreeMap::new();
        for a in adapters {
            let one = Plan::new(vec![a.clone()]);
            for name in one.tensors() {
                let e = by_tensor.entry(name.to_string()).or_default();
                e.0 = numel(&one.terms(name), name);
                e.1.push(one.operand_bytes(name));
            }
        }
        by_tensor
            .into_values()
            .map(|(numel, mut ops)| {
                ops.sort_unstable_by(|a, b| b.cmp(a));
                numel * 4 + ops.iter().take(most).sum::<usize>()
            })
            .max()
            .unwrap_or(0)
    }
}

/// Values in tensor `name`, from the targets of its first update.
fn numel(terms: &[Term], name: &str) -> usize {
    terms.first().and_then(|t| t.module.targets.iter().find(|t| t.0 == name)).map_or(0, |t| t.1.iter().product())
}

/// Seconds the merges took: the host's (on the GPU backend, preparing the factors: their bytes
/// into the upload ring, device memory; not waits for the device) and the device's (the factors'
/// copies and widening, the merge kernels; read from events once they have finished), apart. The
/// two overlap (the host prepares the next tensor while the device merges one), so their sum
/// bounds the merge's cost from above.
#[derive(Default)]
pub struct MergeClock {
    state: Mutex<ClockState>,
}

pub type Pending = Box<dyn FnOnce() -> f64 + Send>;

/// What a [`MergeClock`] counted.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MergeTime {
    pub host_s: f64,
    pub device_s: f64,
    /// Merged tensors (streamed blocks count at every fetch).
    pub tensors: usize,
}

impl MergeTime {
    /// Host and device seconds together: the merge's cost if nothing overlapped.
    pub fn total_s(&self) -> f64 {
        self.host_s + self.device_s
    }

    /// What was counted after `earlier` (a total read before this one).
    pub fn since(&self, earlier: &MergeTime) -> MergeTime {
        MergeTime { host_s: self.host_s - earlier.host_s, device_s: self.device_s - earlier.device_s, tensors: self.tensors - earlier.tensors }
    }

    /// The `--json` timings entries: `lora_merge_s` (host and device together, the cost if
    /// nothing overlapped), `lora_merge_host_s`, `lora_merge_device_s`.
    pub fn json_entries(&self) -> [(&'static str, f64); 3] {
        [("lora_merge_s", self.total_s()), ("lora_merge_host_s", self.host_s), ("lora_merge_device_s", self.device_s)]
    }

    /// For the `-v` timings line: `0.123 s (host 0.040, device 0.083)`.
    pub fn line(&self) -> String {
        format!("{:.3} s (host {:.3}, device {:.3})", self.total_s(), self.host_s, self.device_s)
    }
}

#[derive(Default)]
struct ClockState {
    time: MergeTime,
    /// Device intervals still on the stream: each call waits for its end and gives its seconds.
    pending: Vec<Pending>,
}

/// Device intervals kept before the oldest are read (a streamed DiT merges at every fetch).
const PENDING_MAX: usize = 256;

impl MergeClock {
    /// One merged tensor's host time.
    pub fn add_host(&self, seconds: f64) {
        let mut s = self.state.lock().unwrap();
        s.time.host_s += seconds;
        s.time.tensors += 1;
    }

    /// A device interval of a merge, read (waiting for its end) when the total is asked for.
    pub fn add_device(&self, interval: Pending) {
        let mut s = self.state.lock().unwrap();
        s.pending.push(interval);
        if s.pending.len() > PENDING_MAX {
            let old: Vec<Pending> = s.pending.drain(..PENDING_MAX / 2).collect();
            s.time.device_s += old.into_iter().map(|f| f()).sum::<f64>();
        }
    }

    /// The time spent merging so far (waits for the device intervals).
    pub fn total(&self) -> MergeTime {
        let mut s = self.state.lock().unwrap();
        let pending: Vec<Pending> = s.pending.drain(..).collect();
        s.time.device_s += pending.into_iter().map(|f| f()).sum::<f64>();
        s.time
    }
}

impl std::fmt::Debug for MergeClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock().unwrap();
        write!(f, "MergeClock({:?}, {} pending)", s.time, s.pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::keys::{Delta, Mat};
    use crate::lora::LoraSpec;

    fn lora(scale: f32, modules: Vec<Module>) -> Lora {
        Lora { spec: LoraSpec { path: "a.safetensors".into(), scale }, hash: crate::lora::FileHash::known(""), format: "kohya".into(), modules }
    }

    /// A rank-`r` module onto `targets` (name, rows), `cols` wide.
    fn module(key: &str, targets: &[(&str, usize)], cols: usize, r: usize) -> Module {
        let rows: usize = targets.iter().map(|t| t.1).sum();
        Module {
            key: key.into(),
            targets: targets.iter().map(|(n, rows)| (n.to_string(), vec![*rows, cols])).collect(),
            delta: Delta::LowRank { up: Mat::new(vec![rows, r], vec![0.5; rows * r]), down: Mat::new(vec![r, cols], vec![0.25; r * cols]), alpha: None },
        }
    }

    #[test]
    fn terms_by_tensor_in_order_with_row_offsets() {
        let qkv = [("b.q.weight", 8), ("b.k.weight", 8), ("b.v.weight", 8)];
        let plan = Plan::new(vec![
            lora(0.5, vec![module("b.qkv", &qkv, 16, 4), module("b.o", &[("b.o.weight", 16)], 16, 2)]),
            lora(2.0, vec![module("b.q", &[("b.q.weight", 8)], 16, 3)]),
        ]);
        let q = plan.terms("b.q.weight");
        assert_eq!(q.len(), 2);
        assert_eq!((q[0].module.key.as_str(), q[0].row0, q[0].scale), ("b.qkv", 0, 0.5));
        assert_eq!((q[1].module.key.as_str(), q[1].row0, q[1].scale), ("b.q", 0, 2.0));
        let rows = |n: &str| plan.terms(n).iter().map(|t| t.row0).collect::<Vec<_>>();
        assert_eq!((rows("b.k.weight"), rows("b.v.weight"), rows("b.o.weight")), (vec![8], vec![16], vec![0]));
        assert!(plan.terms("b.ffn.weight").is_empty());
        assert_eq!(plan.tensors().collect::<Vec<_>>(), ["b.k.weight", "b.o.weight", "b.q.weight", "b.v.weight"]);
        // The largest one-tensor merge: q's fp32 sum (two updates) and both updates' factors in
        // fp32 (f32 values here: no stored copy; the fused module's whole), each aligned to 256 bytes.
        let fused = (4 * 24 * 4 + 256) + (4 * 4 * 16 + 256);
        let own = (4 * 8 * 3 + 256) + (4 * 3 * 16 + 256);
        assert_eq!(plan.scratch_bytes(), 8 * 16 * 4 + fused + own);
        assert_eq!(Plan::default().scratch_bytes(), 0);
    }

    /// The bound over every choice of at most `most` adapters: each choice's scratch is within
    /// it, and the worst pair reaches it (factors in f32: 4 bytes a value + 256 per buffer).
    #[test]
    fn scratch_bound_covers_every_choice() {
        let qkv = [("b.q.weight", 8), ("b.k.weight", 8), ("b.v.weight", 8)];
        let a = lora(1.0, vec![module("b.qkv", &qkv, 16, 4), module("b.o", &[("b.o.weight", 16)], 16, 2)]);
        let b = lora(1.0, vec![module("b.q", &[("b.q.weight", 8)], 16, 3)]);
        let c = lora(1.0, vec![module("b.o", &[("b.o.weight", 16)], 16, 8)]);
        let all = [a.clone(), b.clone(), c.clone()];
        // o: its fp32 sum (16 x 16) and the operands of a (16x2, 2x16) and c (16x8, 8x16).
        let o_ac = 16 * 16 * 4 + (4 * 32 + 256) * 2 + (4 * 128 + 256) * 2;
        assert_eq!(Plan::scratch_bound(&all, 2), o_ac);
        assert_eq!(Plan::new(vec![c.clone(), a.clone()]).scratch_bytes(), o_ac, "the worst pair reaches it");
        // One adapter: o's sum and c's operands.
        assert_eq!(Plan::scratch_bound(&all, 1), 16 * 16 * 4 + (4 * 128 + 256) * 2);
        for set in [vec![a.clone()], vec![b.clone()], vec![c.clone()], vec![a.clone(), b.clone()], vec![b, c]] {
            assert!(Plan::new(set.clone()).scratch_bytes() <= Plan::scratch_bound(&all, set.len()));
        }
        assert_eq!(Plan::scratch_bound(&[], 4), 0);
        let floor = Plan { scratch_floor: o_ac, ..Plan::default() };
        assert_eq!(floor.scratch_bytes(), o_ac, "an empty plan made for later choices keeps their room");
    }

    /// A rank-64 adapter on every linear of the full-size DiT, factors stored in bf16 as files
    /// hold them: the largest merge is ffn_up_gate's, both factors in fp32 plus their bf16 copies.
    #[test]
    fn scratch_of_a_full_size_rank_64_adapter() {
        let (dim, ffn, r) = (3072, 8192, 64);
        let bf16 = |rows: usize, cols: usize| {
            let n = 2 * rows * cols;
            let bytes: crate::lora::keys::Bytes = std::sync::Arc::new(vec![0u8; n]);
            Mat::stored(vec![rows, cols], crate::checkpoint::Dtype::BF16, bytes, 0..n).unwrap()
        };
        let mut modules = vec![];
        for l in 0..42 {
            for (p, o, i) in [("q", dim, dim), ("k", dim, dim), ("v", dim, dim), ("o", dim, dim), ("ffn_up_gate", 2 * ffn, dim), ("ffn_down", dim, ffn)] {
                let name = format!("layers.{l}.proj.{p}.weight");
                let delta = Delta::LowRank { up: bf16(o, r), down: bf16(r, i), alpha: Some(r as f32) };
                modules.push(Module { key: name.clone(), targets: vec![(name, vec![o, i])], delta });
            }
        }
        let plan = Plan::new(vec![lora(1.0, modules)]);
        let want = (4 + 2) * (2 * ffn * r + r * dim) + 4 * 256;
        assert_eq!(plan.scratch_bytes(), want);
        println!("full-size rank-64 adapter: merge scratch {:.1} MiB", want as f64 / (1 << 20) as f64);
    }

    #[test]
    fn clock_adds_host_and_device_time_apart() {
        let c = MergeClock::default();
        c.add_host(0.25);
        c.add_device(Box::new(|| 0.5));
        c.add_host(0.125);
        assert_eq!(c.total(), MergeTime { host_s: 0.375, device_s: 0.5, tensors: 2 });
        assert_eq!(c.total().total_s(), 0.875);
        for _ in 0..PENDING_MAX + 10 {
            c.add_device(Box::new(|| 1.0));
        }
        let before = c.total();
        assert_eq!(before.device_s, 0.5 + (PENDING_MAX + 10) as f64);
        assert_eq!(before.host_s, 0.375);
        c.add_host(0.5);
        c.add_device(Box::new(|| 0.25));
        assert_eq!(c.total().since(&before), MergeTime { host_s: 0.5, device_s: 0.25, tensors: 1 });
    }
}
