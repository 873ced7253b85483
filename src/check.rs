//! `moss check`: the checkpoint, component by component, and (with the CUDA issues) every GPU
//! kernel against the CPU reference with a planted control.

use crate::backend::cuda::{check::gates, plan, Cuda, DType, MemoryPlan};
use crate::backend::Device;
use crate::checkpoint::Checkpoint;
use crate::options::Precision;
use crate::prompt::PromptTokenizer;
use anyhow::Result;

/// One printed row.
pub struct Row {
    pub component: String,
    pub params: usize,
    pub bytes: usize,
    pub dtypes: String,
    pub verdict: Result<(), String>,
}

fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else {
        format!("{:.1} kB", b / 1e3)
    }
}

/// Check every component of the checkpoint; the rows, in model_index order.
pub fn checkpoint_rows(ck: &Checkpoint) -> Vec<Row> {
    let mut rows = vec![];
    let tok = PromptTokenizer::from_file(&ck.tokenizer_path()).and_then(|t| {
        for s in ["<|im_start|>", "<|im_end|>", "<think>"] {
            t.token_id(s).ok_or_else(|| anyhow::anyhow!("tokenizer has no `{s}` token"))?;
        }
        let ids = t.encode("", 4096)?;
        anyhow::ensure!(ids.ids.len() < 16, "the chat suffix does not tokenize to single tokens");
        Ok(())
    });
    rows.push(Row {
        component: "tokenizer".into(),
        params: 0,
        bytes: std::fs::metadata(ck.tokenizer_path()).map(|m| m.len() as usize).unwrap_or(0),
        dtypes: "-".into(),
        verdict: tok.map_err(|e| format!("{e:#}")),
    });
    rows.push(Row { component: "scheduler".into(), params: 0, bytes: 0, dtypes: "-".into(), verdict: Ok(()) });
    for name in ["text_encoder", "transformer", "vae"] {
        match ck.open_component(name) {
            Ok(c) => {
                let (params, bytes, dtypes) = c.summary();
                let mut verdict = match c.first_non_finite() {
                    None => Ok(()),
                    Some((t, i)) => Err(format!("tensor `{t}` holds a non-finite value at element {i}")),
                };
                let mut dtypes = dtypes.join(",");
                if c.store.single_file {
                    let kept = match kept_on_gpu(&c) {
                        Ok(k) => k,
                        Err(e) => {
                            verdict = verdict.and(Err(format!("{e:#}")));
                            String::new()
                        }
                    };
                    dtypes = format!("{dtypes} ({}: {}{kept})", c.store.format, ck.files.of(name).map_or(String::new(), |f| f.display().to_string()));
                }
                rows.push(Row { component: name.into(), params, bytes, dtypes, verdict });
            }
            Err(e) => rows.push(Row { component: name.into(), params: 0, bytes: 0, dtypes: "-".into(), verdict: Err(format!("{e:#}")) }),
        }
    }
    rows
}

/// What the GPU keeps of a single-file component as stored (`kept::Layout`), checked as it would
/// load it (every int8 scale finite, every matrix whole blocks); a ConvRot group the GPU refuses is
/// named. `""` when nothing is quantized.
fn kept_on_gpu(c: &crate::checkpoint::Component) -> Result<String> {
    use crate::checkpoint::kept::{gpu_refusal, Layout};
    let (mut n, mut bytes, mut refused) = (0, 0, None);
    for (k, t) in c.store.tensors.iter().filter(|(k, t)| k.starts_with(&c.prefix) && t.dtype.is_block_or_int8()) {
        let name = &k[c.prefix.len()..];
        if let Some(r) = gpu_refusal(k, t) {
            refused.get_or_insert(r);
            continue;
        }
        if let Some(l) = Layout::of(c, &[name])? {
            l.pieces(c, &[t])?;
            n += 1;
            bytes += l.bytes;
        }
    }
    if n == 0 && refused.is_none() {
        return Ok(String::new());
    }
    let mut s = format!("; on the GPU {n} matrices kept as stored, {}", human(bytes));
    if let Some(r) = refused {
        s.push_str(&format!("; refused on the GPU: {r}"));
    }
    Ok(s)
}

/// Print the table; true if everything passed.
/// How `moss check --device cuda` runs its gates.
#[derive(Clone, Copy, Debug, Default)]
pub struct GateOptions {
    /// The inputs' seed; a fresh one when None.
    pub seed: Option<u64>,
    /// Each gate family's time on stderr.
    pub verbose: bool,
}

pub fn run(ck: &Checkpoint, device: Option<Device>, o: GateOptions) -> bool {
    println!("checkpoint {} ({})", ck.loc.root.display(), ck.loc.id);
    println!("{:<13} {:>15} {:>10} {:<9} verdict", "component", "parameters", "bytes", "dtypes");
    let mut ok = true;
    let t = std::time::Instant::now();
    let rows = checkpoint_rows(ck);
    let scanned: usize = rows.iter().map(|r| r.bytes).sum();
    for r in rows {
        let v = match &r.verdict {
            Ok(()) => "ok".to_string(),
            Err(e) => {
                ok = false;
                format!("FAIL: {e}")
            }
        };
        println!("{:<13} {:>15} {:>10} {:<9} {v}", r.component, r.params, human(r.bytes), r.dtypes);
    }
    println!("weights: {} scanned for NaN/Inf in {:.2} s", human(scanned), t.elapsed().as_secs_f64());
    match device {
        None | Some(Device::Cpu) => {
            println!("kernels: not checked (pass --device cuda to gate the GPU kernels)");
        }
        Some(Device::Cuda(n)) => {
            if !check_cuda(ck, n, o) {
                ok = false;
            }
        }
    }
    println!("{}", if ok { "check: all passed" } else { "check: FAILED" });
    ok
}

/// `--device cuda`: open the GPU, gate every kernel (both precisions), show the memory plan of
/// the checkpoint's DiT and time `linear`. True if every gate passed and every control failed.
fn check_cuda(ck: &Checkpoint, n: usize, o: GateOptions) -> bool {
    let cuda = match Cuda::new(n, Precision::Bf16) {
        Ok(c) => c,
        Err(e) => {
            println!("device cuda:{n}: FAIL: {e:#}");
            return false;
        }
    };
    let g = cuda.gpu();
    let (free, total) = g.mem_info().unwrap_or((0, 0));
    println!(
        "device cuda:{n}: {} (sm_{}{}), {:.1} of {:.1} GiB free, kernels built for sm_{}",
        g.name,
        g.compute_capability.0,
        g.compute_capability.1,
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64,
        crate::backend::cuda::kernel_archs().unwrap_or("-")
    );
    // Fresh inputs every run; --seed repeats one.
    let seed = o.seed.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1));
    let t = std::time::Instant::now();
    let mut ok = gates::run_all(&cuda, Some(ck), seed, o.verbose);
    println!("kernel gates took {:.1} s", t.elapsed().as_secs_f64());
    if let Err(e) = cuda.trim_pool() {
        println!("device: FAIL after the gates: {e:#}");
        ok = false;
    }
    if let Ok(c) = ck.open_component_for_plan("transformer") {
        // What `generate` would ask for at 1024x1024 with a 128-token prompt.
        let tokens = (1024 / 16) * (1024 / 16) + 128;
        for p in [Precision::Bf16, Precision::Fp32] {
            let plan = MemoryPlan::component(&c, p).activations(plan::dit_activation_bytes(&ck.dit, tokens, DType::of(p)));
            let verdict = match plan.check(g) {
                Ok(()) => "fits".to_string(),
                Err(e) => format!("would not fit: {e:#}"),
            };
            println!("memory plan: transformer at {p:?}, {tokens} tokens: needs {:.2} GiB: {verdict}", plan.needed() as f64 / (1u64 << 30) as f64);
        }
    }
    if let Err(e) = gates::time_ops(&cuda) {
        println!("timing: FAIL: {e:#}");
        ok = false;
    }
    ok
}
