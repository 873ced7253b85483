//! The launcher generator (`build/kernels.rs`) on fixtures, a caller that passes a wrong type
//! failing to compile against what it generates, and the generated launchers of this build.

use super::generator::{generate, parse, stem, Kernel, Ty};
use super::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the C preprocessor makes of a kernel file: line markers, the `using` alias, the
/// macro-written kernels expanded.
const FIXTURE: &str = r#"# 1 "cuda/fixture.cu"
using bf16 = __nv_bfloat16;
template <typename T> __device__ void scale_impl(T* out, const T* x, long n, int d, float s) {}

extern "C" __global__ void __launch_bounds__(256) moss_scale_bf16(bf16* out, const bf16* __restrict__ x, long n, int d, float s) { scale_impl<bf16>(out, x, n, d, s); } extern "C" __global__ void __launch_bounds__(256) moss_scale_f32(float* out, const float* __restrict__ x, long n, int d, float s) { scale_impl<float>(out, x, n, d, s); }
# 9 "cuda/fixture.cu"
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1)
    moss_tile(const __grid_constant__ moss_tma::TmaMap tx, __nv_bfloat16* out, const void* w, int wbf, unsigned long long seed);
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1)
    moss_tile(const __grid_constant__ moss_tma::TmaMap tx, __nv_bfloat16* out, const void* w, int wbf, unsigned long long seed) {}
"#;

/// The same file in the check image: a planted twin of `moss_scale`.
const FIXTURE_CHECK: &str = r#"# 1 "cuda/fixture.cu"
using bf16 = __nv_bfloat16;
extern "C" __global__ void moss_ctl_scale_bf16(bf16* out, const bf16* x, long n, int d, float s) {}
"#;

fn fixture() -> (Vec<Kernel>, Vec<Kernel>) {
    (parse(FIXTURE).unwrap(), parse(FIXTURE_CHECK).unwrap())
}

#[test]
fn reads_the_kernels_with_their_types_and_places() {
    let (ks, _) = fixture();
    let names: Vec<&str> = ks.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["moss_scale_bf16", "moss_scale_f32", "moss_tile"], "declared then defined counts once");
    let k = &ks[0];
    assert_eq!(k.at, "cuda/fixture.cu:4");
    let tys: Vec<&Ty> = k.params.iter().map(|p| &p.ty).collect();
    assert_eq!(tys, [&Ty::Ptr("BF16"), &Ty::Ptr("BF16"), &Ty::Value("i64"), &Ty::Value("i32"), &Ty::Value("f32")], "bf16 is read through its `using`");
    assert_eq!(k.params[1].name, "x");
    assert_eq!(ks[1].params[0].ty, Ty::Ptr("F32"));
    let tile = &ks[2];
    assert_eq!(tile.at, "cuda/fixture.cu:9");
    let tys: Vec<&Ty> = tile.params.iter().map(|p| &p.ty).collect();
    assert_eq!(tys, [&Ty::Value("&TensorMap"), &Ty::Ptr("BF16"), &Ty::Ptr("Void"), &Ty::Value("i32"), &Ty::Value("u64")]);
}

#[test]
fn families_are_names_less_their_element_types() {
    assert_eq!(stem("moss_add_bf16_f32"), "moss_add");
    assert_eq!(stem("moss_copy2d_u16"), "moss_copy2d");
    assert_eq!(stem("moss_rms_mod_fp8_f32_bf16_to_bf16"), "moss_rms_mod_fp8_to");
    assert_eq!(stem("moss_vae_to_rgb8"), "moss_vae_to_rgb8");
    assert_eq!(stem("moss_enc_gdr_seq_tc"), "moss_enc_gdr_seq_tc");
}

#[test]
fn generates_one_typed_launcher_per_parameter_list() {
    let (p, c) = fixture();
    let rs = generate(&p, &c).unwrap();
    assert!(rs.contains("pub static SCALE: Family<fn(Dev, Dev, i64, i32, f32)>"), "{rs}");
    assert!(rs.contains(r#"Member { name: "moss_scale_f32", elems: &[Elem::F32, Elem::F32] }"#), "{rs}");
    assert!(rs.contains("pub static TILE: Family<fn(&TensorMap, Dev, Dev, i32, u64)>"), "{rs}");
    assert!(rs.contains("pub fn launch(&self, cuda: &Cuda, cfg: impl Into<Cfg>, a0: impl Into<Dev>, a1: impl Into<Dev>, a2: i64, a3: i32, a4: f32)"), "{rs}");
    let controls = &rs[rs.find("pub mod controls").expect("the check image's module")..];
    assert!(controls.contains("pub static CTL_SCALE: Family<fn(Dev, Dev, i64, i32, f32)>"), "{controls}");
    assert_eq!(rs.matches("impl Family<fn(Dev, Dev, i64, i32, f32)>").count(), 1, "one launcher for both families");
}

#[test]
fn a_type_it_cannot_map_stops_the_build_naming_the_kernel() {
    let text = "# 3 \"cuda/odd.cu\"\nextern \"C\" __global__ void moss_odd_bf16(__nv_bfloat162* x, long n) {}\n";
    let e = parse(text).unwrap_err();
    assert!(e.contains("moss_odd_bf16") && e.contains("cuda/odd.cu:3") && e.contains("__nv_bfloat162*"), "{e}");
    let e = parse("extern \"C\" __global__ void moss_odd(MossThing t) {}").unwrap_err();
    assert!(e.contains("moss_odd") && e.contains("MossThing"), "{e}");
    let e = parse("extern \"C\" __global__ void moss_odd(float** p) {}").unwrap_err();
    assert!(e.contains("moss_odd") && e.contains("pointer to a pointer"), "{e}");
    let e = parse("template <int B> __global__ void moss_templ(float* p) {}").unwrap_err();
    assert!(e.contains("moss_templ") && e.contains("without `extern \"C\"`"), "{e}");
    let e = parse("using T = float; using T = int;\nextern \"C\" __global__ void moss_odd(T* p) {}").unwrap_err();
    assert!(e.contains("moss_odd") && e.contains("aliased"), "{e}");
}

#[test]
fn members_of_a_family_must_agree() {
    let k = |src: &str| parse(src).unwrap();
    let differ = k("extern \"C\" __global__ void moss_sc_bf16(__nv_bfloat16* o, long n) {}\nextern \"C\" __global__ void moss_sc_f32(float* o, int n) {}");
    let e = generate(&differ, &[]).unwrap_err();
    assert!(e.contains("moss_sc_bf16") && e.contains("moss_sc_f32") && e.contains("different parameters"), "{e}");
    let same = k("extern \"C\" __global__ void moss_sc_bf16(float* o, long n) {}\nextern \"C\" __global__ void moss_sc_f32(float* o, long n) {}");
    let e = generate(&same, &[]).unwrap_err();
    assert!(e.contains("cannot tell them apart"), "{e}");
    let (p, _) = fixture();
    let e = generate(&p, &p[..1]).unwrap_err();
    assert!(e.contains("moss_scale_bf16") && e.contains("both images"), "{e}");
    let twice: Vec<Kernel> = p.iter().chain(&p[..1]).cloned().collect();
    let e = generate(&twice, &[]).unwrap_err();
    assert!(e.contains("moss_scale_bf16") && e.contains("two translation units"), "{e}");
}

/// rustc from the toolchain that runs this test.
fn rustc() -> PathBuf {
    if let Some(r) = std::env::var_os("RUSTC") {
        return r.into();
    }
    let sibling = Path::new(env!("CARGO")).with_file_name("rustc");
    if sibling.is_file() {
        sibling
    } else {
        "rustc".into()
    }
}

/// What `kernels.rs` gives the generated code, reduced to types (no GPU).
const PRELUDE: &str = r#"#![allow(dead_code, unused)]
use std::ffi::c_void;
use std::marker::PhantomData;
pub type Result<T> = std::result::Result<T, ()>;
#[derive(Clone, Copy)]
pub enum Elem { BF16, F32, F8E4M3, F16, F64, I32, I64, U32, U16, U8, U32x2, U32x4, F32x2, Void }
#[derive(Clone, Copy)]
pub struct Dev { pub ptr: u64, pub elem: Elem }
pub struct Cfg;
impl From<(u32, u32, u32)> for Cfg { fn from(_: (u32, u32, u32)) -> Cfg { Cfg } }
pub struct Member { pub name: &'static str, pub elems: &'static [Elem] }
pub struct FamilyInfo { pub stem: &'static str, pub members: &'static [Member] }
pub struct Family<S> { pub info: FamilyInfo, sig: PhantomData<S> }
impl<S> Family<S> { pub const fn new(info: FamilyInfo) -> Family<S> { Family { info, sig: PhantomData } } }
pub struct Cuda;
impl Cuda { pub fn launch_family(&self, _: &FamilyInfo, _: Cfg, _: &[Elem], _: &mut [*mut c_void]) -> Result<()> { Ok(()) } }
pub struct PermArgs;
pub struct TensorMap;
fn arg<T>(v: &T) -> *mut c_void { v as *const T as *mut c_void }
include!("generated.rs");
"#;

/// Type-checks the launchers generated from `kernels` with `caller` appended; the compiler's
/// errors on failure.
fn compile(kernels: &str, caller: &str, dir: &Path) -> std::result::Result<(), String> {
    std::fs::create_dir_all(dir).unwrap();
    let rs = generate(&parse(kernels).map_err(|e| e.to_string())?, &[])?;
    std::fs::write(dir.join("generated.rs"), rs).unwrap();
    std::fs::write(dir.join("lib.rs"), format!("{PRELUDE}\n{caller}\n")).unwrap();
    let out = Command::new(rustc())
        .args(["--edition", "2021", "--crate-type", "lib", "--emit=metadata", "--crate-name", "fixture", "-o"])
        .arg(dir.join("fixture.rmeta"))
        .arg(dir.join("lib.rs"))
        .output()
        .expect("rustc runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A planted mismatch: the caller passes an `int` where the kernel takes a `long`, and does not
/// compile; the right call does; and when the kernel's parameter changes to `int`, the call that
/// was right stops compiling.
#[test]
fn a_caller_passing_a_wrong_type_does_not_compile() {
    let dir = std::env::temp_dir().join(format!("moss-kernels-typecheck-{}", std::process::id()));
    let long_n = "extern \"C\" __global__ void moss_scale_f32(float* out, const float* x, long n, float s) {}";
    let int_n = "extern \"C\" __global__ void moss_scale_f32(float* out, const float* x, int n, float s) {}";
    let right = "pub fn call(c: &Cuda, d: Dev, n: usize) -> Result<()> { SCALE.launch(c, (1, 256, 0), d, d, n as i64, 0.5) }";
    let wrong = "pub fn call(c: &Cuda, d: Dev, n: usize) -> Result<()> { SCALE.launch(c, (1, 256, 0), d, d, n as i32, 0.5) }";
    let short = "pub fn call(c: &Cuda, d: Dev, n: usize) -> Result<()> { SCALE.launch(c, (1, 256, 0), d, d, n as i64) }";
    assert_eq!(compile(long_n, right, &dir), Ok(()));
    let e = compile(long_n, wrong, &dir).expect_err("an i32 for a `long`");
    assert!(e.contains("E0308") && e.contains("expected `i64`, found `i32`"), "{e}");
    let e = compile(long_n, short, &dir).expect_err("an argument missing");
    assert!(e.contains("E0061"), "{e}");
    let e = compile(int_n, right, &dir).expect_err("the kernel changed under its caller");
    assert!(e.contains("E0308") && e.contains("expected `i32`, found `i64`"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_launch_takes_the_member_of_its_arguments_types() {
    use Elem::{BF16, F32, F8E4M3};
    assert_eq!(ADD.info.member(&[BF16, BF16, F32]).unwrap(), "moss_add_bf16_f32");
    assert_eq!(RMS_MOD.info.member(&[F32, F32, BF16, BF16, BF16]).unwrap(), "moss_rms_mod_f32_bf16");
    assert_eq!(RMS_MOD_TO.info.member(&[BF16, F32, BF16, BF16, BF16]).unwrap(), "moss_rms_mod_f32_bf16_to_bf16");
    // e4m3 codes go to `unsigned char*`
    assert_eq!(QUANTIZE_FP8.info.member(&[F8E4M3, F32, BF16]).unwrap(), "moss_quantize_fp8_bf16");
    let e = ADD.info.member(&[BF16, F8E4M3, F32]).unwrap_err().to_string();
    assert!(e.contains("moss_add") && e.contains("F8E4M3"), "{e}");
    assert!(ADD.info.member(&[BF16, BF16]).is_err(), "too few pointers");
}

#[test]
fn a_control_must_take_its_twins_parameters() {
    let p = parse("extern \"C\" __global__ void moss_sc_f32(float* o, long n) {}").unwrap();
    let c = parse("extern \"C\" __global__ void moss_ctl_sc_f32(float* o, int n) {}").unwrap();
    let e = generate(&p, &c).unwrap_err();
    assert!(e.contains("moss_ctl_sc_f32") && e.contains("moss_sc_f32") && e.contains("other parameters"), "{e}");
    let c = parse("extern \"C\" __global__ void moss_ctl_sc_f32(float* o, long n) {}").unwrap();
    assert!(generate(&p, &c).unwrap().contains("TWINS: &[(&FamilyInfo, &FamilyInfo)] = &[(&super::SC.info, &CTL_SC.info)]"));
}

#[test]
fn a_check_view_swaps_only_what_it_names() {
    let img = Image::production().swap(&RMS_NORM, &controls::CTL_RMS_NOPLUS);
    assert_eq!(img.resolve(&RMS_NORM.info).stem, "moss_ctl_rms_noplus");
    assert_eq!(img.resolve(&ADD.info).stem, "moss_add");
    assert!(!img.is_production() && Image::production().is_production());
    let enc = Image::production().twins(|s| s.starts_with("moss_enc_"));
    assert_eq!(enc.resolve(&ENC_GDR_OUT_TC.info).stem, "moss_ctl_enc_gdr_out_tc");
    assert_eq!(enc.resolve(&ENC_GDR_SEQ_TC.info).stem, "moss_enc_gdr_seq_tc", "no twin: production");
    assert_eq!(enc.resolve(&RMS_NORM.info).stem, "moss_rms_norm");
}

/// Every family holds at least one kernel, the two images share no stem, and every control
/// is named as a check-image kernel.
#[test]
fn the_images_families_are_apart() {
    assert!(ALL.len() > 50 && controls::ALL.len() > 50, "{} production, {} check families", ALL.len(), controls::ALL.len());
    for f in ALL.iter().chain(controls::ALL) {
        assert!(!f.members.is_empty(), "{}", f.stem);
        assert!(f.members.iter().all(|m| m.name.starts_with(f.stem.trim_end_matches("_to"))), "{}", f.stem);
    }
    for f in controls::ALL {
        assert!(!ALL.iter().any(|p| p.stem == f.stem), "{}", f.stem);
        assert!(f.stem.starts_with("moss_ctl") || f.stem.ends_with("_control"), "{} in the check image", f.stem);
    }
}

/// The production kernels the generator read are the ones nvcc compiled (its resource report
/// names every entry function; a build without kernels has none to compare).
#[test]
fn the_generator_reads_what_nvcc_compiles() {
    use crate::contract::{records, RESOURCES};
    if RESOURCES.is_empty() {
        eprintln!("kernel launchers: built without kernels (no nvcc), nothing to compare");
        return;
    }
    let built: std::collections::BTreeSet<String> = records(RESOURCES).into_iter().map(|r| r.kernel).collect();
    let read: std::collections::BTreeSet<String> = ALL.iter().flat_map(|f| f.members.iter().map(|m| m.name.to_string())).collect();
    assert_eq!(read, built);
}
