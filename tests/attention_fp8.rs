//! The e4m3 attention's CPU twin (`src/backend/cpu/attention_fp8.rs`: the arithmetic of the Hopper
//! kernels `--precision fp8` runs, and the reference `moss check` gates them against) against
//! golden/make_attention_fp8.py (torch, written independently of the Rust code): every q, k and v
//! code and every scale exactly, every query row's output to float64 rounding. Control: the exact
//! attention of the same input (the twin without its e4m3 roundings) lands 5.5e-2 away.

mod common;

use common::golden;
use moss::backend::cpu::attention_fp8::{attention_rows, operands};
use moss::checkpoint::TensorStore;
use moss::tensor::{rel_l2, Tensor};

/// Both sides compute in float64 between the same rounding points (the multiplication order of
/// the score's scales differs: an ulp).
const TWIN: f64 = 1e-6;

#[test]
fn twin_is_torchs_e4m3_attention() {
    let store = TensorStore::open_file(&golden().join("expected").join("attention_fp8.safetensors")).unwrap();
    let t = |k: &str| {
        let (shape, data) = store.to_f32(k).unwrap_or_else(|e| panic!("{k}: {e:#}"));
        Tensor::new(shape, data).unwrap()
    };
    let codes = |k: &str| store.bytes(store.get(k).unwrap()).to_vec();
    let (qkv, wq, wk) = (t("qkv"), t("wq"), t("wk"));
    let heads = 2;
    let o = operands(&qkv, heads, &wq, &wk).unwrap();
    for (what, mine, torch) in [("q", &o.q, codes("q.codes")), ("k", &o.k, codes("k.codes")), ("v", &o.v, codes("v.codes"))] {
        let differ = mine.iter().zip(&torch).filter(|(a, b)| a != b).count();
        assert!(mine.len() == torch.len() && differ == 0, "{what}: {differ} of {} codes differ", torch.len());
    }
    assert_eq!(o.scales, t("scales").data, "scales");
    let rows: Vec<usize> = (0..o.n).collect();
    let out = attention_rows(&o, 1.0 / (o.hd as f64).sqrt(), &rows).unwrap();
    let want = t("out");
    let err = rel_l2(&out.data, &want.data);
    let control = rel_l2(&t("exact").data, &want.data);
    println!("twin against torch: rel L2 {err:.3e}; the exact attention (control): {control:.3e}");
    assert!(err < TWIN, "rel L2 {err}");
    assert!(control > TWIN, "the control passes the bound: the test cannot fail");
}
