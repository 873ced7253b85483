//! Streaming is a property of how weights are fetched: a transformer whose blocks are fetched
//! from the checkpoint mapping as each forward reaches them (some or none resident) gives the
//! same PNG bytes as the all-resident one, on both golden checkpoints (CPU backend).

mod common;

use common::{checkpoint, CHECKPOINTS};
use moss::backend::cpu::Cpu;
use moss::model::dit::Dit;
use moss::pipeline::{self, Request, Silent};

fn request(seed: u64) -> Request {
    Request {
        prompt: "a lighthouse on a cliff at dusk".into(),
        negative: String::new(),
        seed,
        steps: 3,
        guidance: 3.0,
        width: 64,
        height: 48,
        out: std::env::temp_dir().join("moss-streaming-test-unused.png"),
        save_latents: None,
        embeds: None,
        prompt_file: None,
        device: moss::backend::Device::Cpu,
        uncond_skip: vec![],
        skip_window: (0.0, 1.0),
        max_tokens: 4096,
        precision: moss::options::Precision::Fp32,
        quality: None,
        cut: Default::default(),
    }
}

fn png(ck: &moss::checkpoint::Checkpoint, dit: &Dit<Cpu>, req: &Request) -> Vec<u8> {
    let texts = pipeline::prompt_texts(req);
    let (enc, _) = pipeline::encode_prompts(&Cpu, ck, &texts, req.max_tokens, req.precision, &mut Silent).unwrap();
    let uncond = enc.get(1).unwrap_or(&enc[0]);
    let z = pipeline::denoise_with(&Cpu, dit, ck, req, &enc[0].hidden, &uncond.hidden, &mut Silent).unwrap();
    let vae = pipeline::load_vae(&Cpu, ck, z.shape[2], z.shape[3]).unwrap();
    pipeline::picture_bytes(&Cpu, &vae, ck, req, &z, &mut Silent).unwrap()
}

#[test]
fn streamed_blocks_give_the_resident_picture_bytes() {
    for name in CHECKPOINTS {
        let ck = checkpoint(name);
        let n = ck.dit.num_layers;
        assert!(n >= 2, "{name}: {n} blocks, the test needs a resident and a streamed one");
        let req = request(11);
        let resident = Dit::load(&Cpu, &ck.open_component("transformer").unwrap(), &ck.dit).unwrap();
        assert_eq!(resident.resident_blocks(), n);
        let want = png(&ck, &resident, &req);
        for k in [0, 1, n - 1] {
            let streamed = Dit::load_streamed(&Cpu, ck.open_component("transformer").unwrap(), &ck.dit, k).unwrap();
            assert_eq!(streamed.resident_blocks(), k, "{name}: {k} resident");
            let got = png(&ck, &streamed, &req);
            assert!(got == want, "{name}: {k} of {n} blocks resident, the PNG differs from the resident run's");
        }
        // The comparison can fail: another seed gives other bytes through the same path.
        assert!(png(&ck, &resident, &request(12)) != want, "{name}: the picture does not depend on the seed");
    }
}
