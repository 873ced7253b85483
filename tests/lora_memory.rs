//! The LoRA merge works one tensor at a time: opening the transformer with adapters attached and
//! loading one updated tensor through the backend allocates about that tensor's worth of memory,
//! never the whole model's deltas. Heap use is counted by a global allocator (one test in this
//! binary, so nothing else allocates meanwhile).

mod common;

use moss::backend::cpu::Cpu;
use moss::backend::Backend;
use moss::lora::LoraSpec;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::SeqCst) + l.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Bytes allocated at the peak of `f` above what was live before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let out = f();
    (out, PEAK.load(Ordering::SeqCst) - base)
}

#[test]
fn merge_memory_is_one_tensors_worth() {
    let lora = |f: &str, scale| LoraSpec { path: common::golden().join("lora").join(f), scale };
    let specs = [
        lora("peft/adapter_model.safetensors", 0.8),
        lora("kohya.safetensors", 0.7),
        lora("qkv.safetensors", 1.1),
        lora("lokr.safetensors", 1.2),
        lora("kohya.safetensors", -0.3),
    ];
    let mut ck = common::checkpoint("tiny-a");
    ck.attach_loras(&specs).unwrap();
    let names: Vec<String> = ck.loras.tensors().map(String::from).collect();
    // What a map of every updated tensor's fp32 delta (the former merge) would hold.
    let (comp, open_peak) = peak_of(|| ck.open_component("transformer").unwrap());
    let all: usize = names.iter().map(|n| 4 * comp.info(n).unwrap().shape.iter().product::<usize>()).sum();
    let biggest = names.iter().map(|n| 4 * comp.info(n).unwrap().shape.iter().product::<usize>()).max().unwrap();
    println!("{} updated tensors, {all} bytes of fp32 deltas in all, the largest {biggest}; opening took {open_peak}", names.len());
    assert!(open_peak < biggest, "opening the transformer allocated {open_peak} bytes: it merges nothing itself");
    for name in &names {
        let t = 4 * comp.info(name).unwrap().shape.iter().product::<usize>();
        let ops: usize = comp.lora_terms(name).iter().map(|t| moss::lora::merge::operand_bytes(t.module, 0)).sum();
        let (w, peak) = peak_of(|| Cpu.load(&comp, name).unwrap());
        drop(w);
        // The loaded tensor, the sum, one update's delta, its operands, and the rounding pass.
        let bound = 4 * t + ops + (64 << 10);
        println!("{name}: peak {peak} bytes (tensor {t}, operands {ops}, bound {bound})");
        assert!(peak <= bound, "{name}: loading took {peak} bytes, more than one tensor's merge ({bound})");
    }
    // The former whole-model map (`all`) would not fit under the opening's peak.
    assert!(all >= 2 * biggest, "the test's adapters must update several tensors' worth");
}
