//! The planner at full size: byte counts of the real model (spec: DiT 42 blocks of dim 3072 and
//! FFN 8192, ~0.33 B other parameters; Qwen3.5-9B encoder ~18 GB bf16 in 32 layers with a
//! 248320 x 4096 embedding table; VAE decoder fp32). Activations are rough inputs per size.

use super::*;

const GB: u64 = 1 << 30;

pub(super) fn nets(bytes_per_param: u64, side: u64) -> Vec<Network> {
    let block_params = 4 * 3072 * 3072 + 3 * 3072 * 8192;
    let dit_other = 326_000_000;
    let embed = 248_320 * 4096;
    let enc_layer = (9_000_000_000 - embed - 50_000_000) / 32;
    let px = side * side;
    vec![
        Network {
            name: "text_encoder",
            weights: (embed + 32 * enc_layer + 50_000_000) * bytes_per_param,
            blocks: 32,
            block_bytes: enc_layer * bytes_per_param,
            all_blocks: 32 * enc_layer * bytes_per_param,
            slot_bytes: enc_layer * bytes_per_param,
            derived_bytes: 0,
            ahead: PREFETCH,
            host_only: embed * bytes_per_param,
            activations: 512 << 20,
            strip_activations: None,
        },
        Network {
            name: "transformer",
            weights: (42 * block_params + dit_other) * bytes_per_param,
            blocks: 42,
            block_bytes: block_params * bytes_per_param,
            all_blocks: 42 * block_params * bytes_per_param,
            slot_bytes: block_params * bytes_per_param,
            derived_bytes: 0,
            ahead: PREFETCH,
            host_only: 0,
            // ~ 1 GiB at 1024x1024, growing with the token count
            activations: px * 1024,
            strip_activations: None,
        },
        Network {
            name: "vae",
            weights: 84_000_000 * 4,
            blocks: 0,
            block_bytes: 0,
            all_blocks: 0,
            slot_bytes: 0,
            derived_bytes: 0,
            ahead: 0,
            host_only: 0,
            activations: px * 3 * 1024,
            strip_activations: Some(px * 3 * 1024 / 8),
        },
    ]
}

fn placement<'a>(p: &'a Plan, name: &str) -> &'a NetworkPlan {
    p.networks.iter().find(|n| n.name == name).unwrap()
}

fn resident_blocks(n: &NetworkPlan) -> u64 {
    match n.placement {
        Placement::Streamed { resident, .. } => resident,
        _ => u64::MAX,
    }
}

#[test]
fn unlimited_keeps_everything_resident() {
    for bpp in [2, 4] {
        let p = plan(u64::MAX, &nets(bpp, 1024)).unwrap();
        assert!(p.networks.iter().all(|n| n.placement == Placement::Resident && n.moved_per_pass == 0));
    }
}

#[test]
fn every_cap_from_4_gib_fits_under_the_cap_and_resident_blocks_grow_with_it() {
    for bpp in [2, 4] {
        let mut last: Vec<u64> = vec![0; 3];
        for cap in [4, 6, 8, 12, 16, 24, 80] {
            let p = plan(cap * GB, &nets(bpp, 1024)).unwrap_or_else(|e| panic!("{bpp} B/param, {cap} GiB: {e}"));
            for (i, n) in p.networks.iter().enumerate() {
                assert!(n.device_bytes <= cap * GB, "{} at {cap} GiB holds {}", n.name, n.device_bytes);
                let k = resident_blocks(n);
                assert!(k >= last[i], "{} at {cap} GiB: {k} resident blocks, fewer than at a smaller cap", n.name);
                last[i] = k;
                if let Placement::Streamed { resident, blocks } = n.placement {
                    assert!(resident < blocks);
                    assert_eq!(n.moved_per_pass, (blocks - resident) * nets(bpp, 1024)[i].block_bytes);
                }
            }
            assert!(!p.line().is_empty() && p.json()["networks"].as_array().unwrap().len() == 3);
        }
    }
}

#[test]
fn bf16_decisions_at_the_common_caps() {
    let at = |cap: u64| plan(cap * GB, &nets(2, 1024)).unwrap();
    // 24 GiB: the 18 GB encoder and the ~10 GB DiT each fit alone.
    assert!(at(24).networks.iter().all(|n| n.placement == Placement::Resident));
    // 16 GiB: the DiT fits, the encoder streams.
    assert_eq!(placement(&at(16), "transformer").placement, Placement::Resident);
    assert!(matches!(placement(&at(16), "text_encoder").placement, Placement::Streamed { .. }));
    // 8 GiB: the DiT streams with some blocks resident.
    assert!(resident_blocks(placement(&at(8), "transformer")) > 0);
    assert!(matches!(placement(&at(8), "transformer").placement, Placement::Streamed { .. }));
    // The VAE at 1024x1024 (~3 GiB activations whole): whole under 4 GiB, strips under 3 GiB.
    let vae = &nets(2, 1024)[2];
    assert_eq!(vae.place(4 * GB).unwrap().placement, Placement::Resident);
    assert_eq!(vae.place(3 * GB).unwrap().placement, Placement::Strips);
}

#[test]
fn below_the_minimum_refuses_naming_the_smallest_cap_that_works() {
    for (bpp, side) in [(2, 1024), (4, 1024), (2, 2048)] {
        let n = nets(bpp, side);
        let least = n.iter().map(Network::minimum).max().unwrap();
        assert!(plan(least, &n).is_ok(), "{bpp} B/param {side}px: its own minimum does not plan");
        let err = plan(least - (1 << 20), &n).unwrap_err().to_string();
        assert!(err.contains("smallest cap that works"), "{err}");
        assert!(err.contains(&format!("{:.2} GiB", least as f64 / GIB)), "{err}");
    }
    let m = |bpp, side| nets(bpp, side).iter().map(Network::minimum).max().unwrap();
    assert!(m(4, 1024) > m(2, 1024), "fp32 weights need more than bf16");
    assert!(m(2, 2048) > m(2, 1024), "a bigger picture needs more");
}

#[test]
fn the_cap_is_clamped_to_the_device_or_taken_from_free_memory() {
    let (total, free) = (140 * GB, 20 * GB);
    let ctx = GB / 2;
    assert_eq!(cap(Some(8.0), free, total, ctx), (8 * GB, None));
    let (c, w) = cap(Some(500.0), free, total, ctx);
    assert_eq!(c, total);
    assert!(w.unwrap().contains("above the device"));
    // Free memory is measured with the context already made: the default cap counts it back in.
    assert_eq!(cap(None, free, total, 0), (free - RESERVE, None));
    assert_eq!(cap(None, free, total, ctx), (free - RESERVE + ctx, None));
    assert_eq!(cap(None, 0, total, 0).0, 0);
}

#[test]
fn the_context_comes_off_the_cap() {
    // What nvidia-smi shows is the context plus the allocations: every network's peak plus the
    // context stays under the cap, and each network gets less room than without a context.
    let ctx = 600 << 20;
    for cap in [4, 6, 8, 12, 24] {
        let n = nets(2, 1024);
        let with = plan_for_process(cap * GB, ctx, &n).unwrap_or_else(|e| panic!("{cap} GiB: {e}"));
        let without = plan(cap * GB, &n).unwrap();
        for (a, b) in with.networks.iter().zip(&without.networks) {
            assert!(a.device_bytes + ctx <= cap * GB, "{} at {cap} GiB: {} + context over the cap", a.name, a.device_bytes);
            assert!(a.device_bytes <= b.device_bytes, "{} at {cap} GiB: more room with a context", a.name);
        }
    }
    // At 8 GiB, the context costs the transformer resident blocks.
    let dit = |p: &Plan| resident_blocks(placement(p, "transformer"));
    let n = nets(2, 1024);
    assert!(dit(&plan_for_process(8 * GB, ctx, &n).unwrap()) < dit(&plan(8 * GB, &n).unwrap()));
    // The smallest cap named includes the context, and works.
    let least = n.iter().map(Network::minimum).max().unwrap() + ctx;
    assert!(plan_for_process(least, ctx, &n).is_ok());
    let err = plan_for_process(least - (1 << 20), ctx, &n).unwrap_err().to_string();
    assert!(err.contains(&format!("{:.2} GiB", least as f64 / GIB)), "{err}");
    assert!(err.contains("CUDA context"), "{err}");
}
