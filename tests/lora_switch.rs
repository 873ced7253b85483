//! Changing a loaded transformer's LoRA set (`moss serve`'s per-request LoRAs, CPU backend): after
//! every change the DiT gives, bit for bit, the latents of a DiT loaded fresh with that set (the
//! base weights restored by reading them again, not by subtracting), whether its blocks are
//! resident or streamed (merged at each fetch), dense or float8 (quantized after the merge; on a
//! float8 checkpoint dequantized, merged and requantized, or its stored codes once no set
//! touches them).

mod common;

use common::folders::{self, tiny_b_fp8, tiny_b_lora};
use common::golden;
use moss::backend::cpu::Cpu;
use moss::backend::Device;
use moss::checkpoint::Checkpoint;
use moss::lora::{LoraSpec, Plan};
use moss::model::dit::{Dit, MainLinears};
use moss::options::Precision;
use moss::pipeline::{self, Request, Silent};
use moss::tensor::Tensor;
use std::collections::BTreeSet;
use std::sync::Arc;

fn request() -> Request {
    let spec = moss::spec::PictureSpec {
        prompt: "a lighthouse on a cliff at dusk".into(),
        seed: 11,
        steps: 2,
        width: 64,
        height: 48,
        uncond_skip: vec![],
        skip_window: (0.0, 1.0),
        precision: Precision::Fp32,
        ..Default::default()
    };
    Request::new(spec, std::env::temp_dir().join("moss-lora-switch-unused.png"), Device::Cpu)
}

/// The prompt's hidden states (cond, uncond), encoded once.
fn hidden(ck: &Checkpoint, req: &Request) -> (Tensor, Tensor) {
    let (enc, _) = pipeline::encode_prompts(&Cpu, ck, &pipeline::prompt_texts(req), req.spec.max_tokens, req.spec.precision, &mut Silent).unwrap();
    let uncond = enc.get(1).unwrap_or(&enc[0]).hidden.clone();
    (enc[0].hidden.clone(), uncond)
}

fn latents(ck: &Checkpoint, dit: &Dit<Cpu>, req: &Request, h: &(Tensor, Tensor)) -> Vec<f32> {
    let z = pipeline::denoise_with(&Cpu, dit, ck, req, &h.0, &h.1, &mut Silent).unwrap();
    dit.end_stream();
    z.data
}

/// `ck` with the adapters `set` (file, scale) as its LoRA plan.
fn with_set(ck: &Checkpoint, set: &[(std::path::PathBuf, f32)]) -> Checkpoint {
    let mut ck = ck.clone();
    ck.loras = Arc::new(Plan::default());
    let specs: Vec<LoraSpec> = set.iter().map(|(p, s)| LoraSpec { path: p.clone(), scale: *s }).collect();
    ck.attach_loras(&specs).unwrap();
    ck
}

/// Walk `sets` on one DiT (`resident` blocks kept, the rest streamed), each change checked
/// against a fresh load; returns the latents of each set.
fn walk(base: &Checkpoint, sets: &[Vec<(std::path::PathBuf, f32)>], linears: MainLinears, resident: usize, what: &str) -> Vec<Vec<f32>> {
    let req = request();
    let h = hidden(base, &req);
    let load = |ck: &Checkpoint| Dit::load_streamed(&Cpu, ck.open_component("transformer").unwrap(), &ck.dit, resident, linears).unwrap();
    let mut held = with_set(base, &[]);
    let mut dit = load(&held);
    assert_eq!(dit.resident_blocks(), resident.min(base.dit.num_layers), "{what}");
    let mut out = vec![];
    for (k, set) in sets.iter().enumerate() {
        let next = with_set(base, set);
        let touched: BTreeSet<String> = held.loras.tensors().chain(next.loras.tensors()).map(String::from).collect();
        let r = dit.set_loras(&Cpu, next.open_component("transformer").unwrap(), &touched).unwrap();
        assert!(set.is_empty() && held.loras.is_empty() || r.blocks + r.parts + r.streamed > 0, "{what}: change {k} reloaded nothing");
        held = next;
        let got = latents(&held, &dit, &req, &h);
        let want = latents(&held, &load(&held), &req, &h);
        assert!(got == want, "{what}: after change {k} the latents differ from a fresh load's with that set");
        out.push(got);
    }
    out
}

#[test]
fn a_changed_set_gives_a_fresh_loads_latents() {
    let base = common::checkpoint("tiny-a");
    let f = |n: &str| golden().join("lora").join(n);
    let a = vec![(f("peft/adapter_model.safetensors"), 0.9), (f("kohya.safetensors"), 0.7)];
    let b = vec![(f("lokr.safetensors"), 1.5), (f("qkv.safetensors"), 0.5), (f("peft/adapter_model.safetensors"), -0.8)];
    let sets = [a.clone(), vec![], b, a];
    let n = base.dit.num_layers;
    for linears in [MainLinears::Dense, MainLinears::Fp8] {
        // peft touches blocks 0 and 22, kohya 3, 4 and the shared modulation, lokr 10, qkv 6.
        for resident in [usize::MAX, 11, 0] {
            let what = format!("tiny-a {linears:?}, {} of {n} blocks resident", resident.min(n));
            let z = walk(&base, &sets, linears, resident, &what);
            let plain = latents(
                &base,
                &Dit::load(&Cpu, &base.open_component("transformer").unwrap(), &base.dit, linears).unwrap(),
                &request(),
                &hidden(&base, &request()),
            );
            assert!(z[1] == plain, "{what}: no set after one is not the checkpoint's own weights");
            assert!(z[0] != plain && z[2] != plain && z[0] != z[2], "{what}: the sets changed nothing");
            assert!(z[3] == z[0], "{what}: a set again gives its first latents");
        }
    }
}

/// A float8 checkpoint: a matrix a set updates is dequantized, merged (and at fp8 requantized),
/// and gets its stored codes back when no set touches it.
#[test]
fn a_float8_checkpoint_changes_sets() {
    let dir = folders::scratch("lora-switch", "fp8");
    let base = folders::open(&tiny_b_fp8(&dir));
    let l = tiny_b_lora(&dir);
    let sets = [vec![(l.clone(), 1.0)], vec![], vec![(l, -0.5)]];
    for linears in [MainLinears::Fp8, MainLinears::Dense] {
        for resident in [usize::MAX, 1] {
            let what = format!("tiny-b-fp8 {linears:?}, {resident} resident");
            let z = walk(&base, &sets, linears, resident, &what);
            assert!(z[0] != z[1] && z[2] != z[1], "{what}: the sets changed nothing");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
