//! The server's planner at full size (the byte counts of `plan::tests`): across caps, sizes
//! and precisions every stage's peak beside what the others keep stays under the cap, the
//! transformer is kept first and with as many blocks as fit, then the VAE, then the encoder's
//! layers, and the smallest cap is the single run's.

use super::super::tests::nets;
use super::super::{plan_for_process, Network, Placement, RESERVE};
use super::*;

const GB: u64 = 1 << 30;
const CAPS: [u64; 11] = [3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 80];

fn keep_of(p: &ServePlan, name: &str) -> Keep {
    p.get(name).unwrap().keep
}

fn blocks_kept(k: Keep) -> Option<u64> {
    match k {
        Keep::Blocks(k) => Some(k),
        Keep::PerRequest => None,
    }
}

/// Network `i` keeping `keep` (the others as planned) fits, the networks kept before it running
/// as planned.
fn fits_with(n: &[Network], p: &ServePlan, i: usize, keep: Keep) -> bool {
    let mut keeps: Vec<Keep> = p.networks.iter().map(|k| k.keep).collect();
    keeps[i] = keep;
    let rank = |j: usize| PRIORITY.iter().position(|&name| name == n[j].name).unwrap();
    let Some(s) = stages(n, &keeps, p.cap - p.overhead) else { return false };
    (0..n.len()).filter(|&j| rank(j) < rank(i)).all(|j| s[j].stage.placement == p.networks[j].stage.placement)
}

#[test]
fn unlimited_keeps_every_network_whole() {
    for bpp in [2, 4] {
        let n = nets(bpp, 2048);
        let p = plan(u64::MAX, 0, &n).unwrap();
        for (k, net) in p.networks.iter().zip(&n) {
            assert_eq!((k.keep, &k.stage.placement, k.bytes), (Keep::Blocks(net.blocks), &Placement::Resident, net.weights), "{}", net.name);
        }
    }
}

#[test]
fn every_cap_holds_every_stage_and_keeps_in_priority_order() {
    let ctx = 600 << 20;
    for (bpp, side) in [(2, 1024), (4, 1024), (2, 2048)] {
        let n = nets(bpp, side);
        let least = n.iter().map(Network::minimum).max().unwrap() + ctx;
        let (dit, vae, enc) = (1, 2, 0);
        let mut last_dit = 0;
        let mut planned = 0;
        for cap in CAPS.map(|c| c * GB) {
            let Ok(p) = plan(cap, ctx, &n) else {
                assert!(cap < least, "{bpp} B/param {side}px: {cap} is above the smallest cap {least} and refused");
                continue;
            };
            planned += 1;
            for k in &p.networks {
                let name = k.stage.name;
                assert!(p.stage_peak(name) <= cap, "{bpp}/{side} at {} GiB: {name}'s stage peaks at {}", cap / GB, p.stage_peak(name));
                assert!(p.idle_bytes() <= p.stage_peak(name), "the idle server holds more than a stage");
                if let (Keep::Blocks(kb), Placement::Streamed { resident, .. }) = (k.keep, &k.stage.placement) {
                    assert_eq!(kb, *resident, "{name}: a kept network streams what it does not keep");
                }
            }
            // The transformer: as many blocks as fit with the others loaded per request.
            let d = blocks_kept(keep_of(&p, "transformer"));
            let more = d.map_or(Keep::Blocks(0), |k| Keep::Blocks(k + 1));
            let alone = |keep| {
                let mut keeps = vec![Keep::PerRequest; 3];
                keeps[dit] = keep;
                stages(&n, &keeps, cap - ctx).is_some()
            };
            if d != Some(n[dit].blocks) {
                assert!(!alone(more), "{bpp}/{side} at {} GiB: the transformer could keep {more:?}", cap / GB);
            }
            let d = d.unwrap_or(0);
            assert!(d >= last_dit, "{bpp}/{side}: fewer transformer blocks kept at {} GiB than below", cap / GB);
            last_dit = d;
            // The VAE and the encoder: kept when they fit beside what is kept before them.
            if keep_of(&p, "vae") == Keep::PerRequest {
                assert!(!fits_with(&n, &p, vae, Keep::Blocks(0)), "{bpp}/{side} at {} GiB: the VAE fits kept", cap / GB);
            }
            match blocks_kept(keep_of(&p, "text_encoder")) {
                Some(k) if k == n[enc].blocks => {}
                Some(k) => assert!(!fits_with(&n, &p, enc, Keep::Blocks(k + 1)), "{bpp}/{side}: one more encoder layer fits"),
                None => assert!(!fits_with(&n, &p, enc, Keep::Blocks(0)), "{bpp}/{side}: the encoder fits kept"),
            }
            assert!(!p.line().is_empty() && p.json()["networks"].as_array().unwrap().len() == 3);
        }
        assert!(planned >= 5, "{bpp}/{side}: only {planned} caps planned");
    }
}

#[test]
fn bf16_decisions_at_the_common_caps() {
    let n = nets(2, 1024);
    let at = |cap: u64| plan(cap * GB, 0, &n).unwrap();
    for cap in [3, 4, 8, 16, 24, 48] {
        println!("{cap} GiB: {}", at(cap).line());
    }
    // 48 GiB: the 18 GB encoder, the ~10 GB DiT and the VAE stay loaded together.
    assert!(at(48).networks.iter().all(|k| k.stage.placement == Placement::Resident && k.bytes > 0));
    // 24 GiB: each fits alone, not together: the DiT and the VAE stay, the encoder keeps some
    // of its layers and streams the rest.
    let p = at(24);
    assert_eq!(keep_of(&p, "transformer"), Keep::Blocks(42));
    assert_eq!(keep_of(&p, "vae"), Keep::Blocks(0));
    let Keep::Blocks(e) = keep_of(&p, "text_encoder") else { panic!("24 GiB: the encoder is not kept") };
    assert!(e > 0 && e < 32, "24 GiB: {e} encoder layers kept");
    assert!(matches!(p.get("text_encoder").unwrap().stage.placement, Placement::Streamed { .. }));
    // 8 GiB: the DiT keeps some blocks and streams the rest.
    let k = blocks_kept(keep_of(&at(8), "transformer")).unwrap();
    assert!(k > 0 && k < 42, "8 GiB: {k} DiT blocks kept");
    // Compared with a single run at the same cap, the server's DiT keeps no more blocks (the
    // others' kept weights sit beside it).
    for cap in [6, 8, 12] {
        let single = plan_for_process(cap * GB, 0, &n).unwrap();
        let alone = match single.networks[1].placement {
            Placement::Streamed { resident, .. } => resident,
            _ => 42,
        };
        assert!(blocks_kept(keep_of(&at(cap), "transformer")).unwrap_or(0) <= alone);
    }
}

#[test]
fn the_smallest_cap_is_the_single_runs() {
    for (bpp, side) in [(2, 1024), (4, 1024), (2, 2048)] {
        let n = nets(bpp, side);
        for ctx in [0, 600 << 20] {
            let least = n.iter().map(Network::minimum).max().unwrap() + ctx;
            let p = plan(least, ctx, &n).unwrap_or_else(|e| panic!("{bpp}/{side}: the smallest cap: {e}"));
            for k in &p.networks {
                assert!(p.stage_peak(k.stage.name) <= least);
            }
            let err = plan(least - (1 << 20), ctx, &n).unwrap_err().to_string();
            let single = plan_for_process(least - (1 << 20), ctx, &n).unwrap_err().to_string();
            assert_eq!(err, single, "the server refuses as a single run does");
            assert!(err.contains(&format!("{:.2} GiB", least as f64 / GIB)) && err.contains("smallest cap that works"), "{err}");
        }
    }
}

#[test]
fn encoder_layers_never_send_the_vae_to_strips() {
    // The VAE runs as it does with the encoder loaded per request: its placement is decided
    // before the encoder's layers take the room left, and its stage gets the room the others
    // leave (whole exactly when that holds the largest picture's activations).
    let mut seen = (0, 0);
    for (bpp, side) in [(2, 1024), (2, 2048), (4, 1024)] {
        let n = nets(bpp, side);
        for cap in CAPS.map(|c| c * GB) {
            let Ok(p) = plan(cap, 0, &n) else { continue };
            let v = p.get("vae").unwrap();
            let mut keeps: Vec<Keep> = p.networks.iter().map(|k| k.keep).collect();
            keeps[0] = Keep::PerRequest;
            let without = stages(&n, &keeps, cap).unwrap();
            assert_eq!(v.stage.placement, without[2].stage.placement, "{bpp}/{side} at {} GiB", cap / GB);
            let room = cap - p.kept_beside("vae");
            let whole = n[2].weights + n[2].activations + RESERVE;
            assert_eq!(v.stage.placement == Placement::Resident, whole <= room, "{bpp}/{side} at {} GiB: {:?}", cap / GB, v.stage.placement);
            if v.stage.placement == Placement::Resident {
                seen.0 += 1;
            } else {
                seen.1 += 1;
            }
        }
    }
    assert!(seen.0 > 0 && seen.1 > 0, "whole {} and strips {} times", seen.0, seen.1);
    // 24 GiB at 1024x1024: the encoder keeps layers and the VAE still decodes whole.
    let p = plan(24 * GB, 0, &nets(2, 1024)).unwrap();
    assert_eq!(p.get("vae").unwrap().stage.placement, Placement::Resident);
    assert!(matches!(keep_of(&p, "text_encoder"), Keep::Blocks(k) if k > 0));
}
