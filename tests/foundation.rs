//! Bit-exact foundations against torch (golden/expected/common.*): the initial noise of
//! `torch.randn` on a CPU generator, and the snapped shift-5 sigmas for 1..200 steps.

mod common;

use common::Expected;

fn ulps(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn noise_is_torch_randn_bit_for_bit() {
    let e = Expected::load("common");
    let entries = e.json["noise"].as_array().unwrap();
    assert!(!entries.is_empty(), "no noise entries in golden/expected/common.json");
    let mut bad_total = 0;
    for n in entries {
        let key = n["key"].as_str().unwrap();
        // Seeds up to 2**64-1: read as u64 (serde_json keeps integers exact).
        let seed = n["seed"].as_u64().unwrap_or_else(|| panic!("{key}: seed {} is not a u64", n["seed"]));
        let shape: Vec<usize> = n["shape"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap() as usize).collect();
        let want = e.tensor(key);
        assert_eq!(want.shape, shape, "{key}");
        let got = moss::noise::torch_randn(seed, shape.iter().product());
        let bad = got.iter().zip(&want.data).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        let worst = got.iter().zip(&want.data).map(|(&a, &b)| ulps(a, b)).max().unwrap();
        println!("{key} seed {seed} {shape:?}: {bad} of {} values differ in their bits (worst {worst} ulp)", got.len());
        bad_total += bad;
    }
    assert_eq!(bad_total, 0, "noise differs from torch.randn");
}

#[test]
fn sigmas_are_torch_bit_for_bit() {
    let e = Expected::load("common");
    let entries = e.json["sigmas"].as_array().unwrap();
    assert_eq!(entries.len(), 200, "sigmas for n = 1..200");
    let mut bad_total = 0;
    for s in entries {
        let key = s["key"].as_str().unwrap();
        let steps = s["steps"].as_u64().unwrap() as usize;
        let cfg = moss::schedule::ScheduleConfig { shift: s["shift"].as_f64().unwrap(), ..Default::default() };
        let want = e.tensor(key);
        let got = moss::schedule::sigmas(steps, &cfg);
        assert_eq!(got.len(), want.numel(), "{key}: {} sigmas, torch has {}", got.len(), want.numel());
        let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i].to_bits() != want.data[i].to_bits()).collect();
        if !bad.is_empty() {
            println!("{key}: {} of {} differ, first at {}: {:e} vs torch {:e}", bad.len(), got.len(), bad[0], got[bad[0]], want.data[bad[0]]);
        }
        bad_total += bad.len();
    }
    println!("sigmas n = 1..200: {bad_total} values differ in their bits");
    assert_eq!(bad_total, 0);
}
