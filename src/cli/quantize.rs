//! `moss quantize`: the folder's transformer as one quantized file (GGUF or ComfyUI comfy_quant
//! safetensors, `moss_core::checkpoint::quantize`), and the single-file components the other
//! commands take (`--transformer`, `--text-encoder`).

use super::args::{Command, QuantizeArgs};
use moss::checkpoint::{self, ComponentFiles, TensorStore};
use moss::pipeline;

/// The component files a command was given, if it takes any.
pub fn component_files(c: &Command) -> Option<ComponentFiles> {
    Some(match c {
        Command::Generate(a) => a.model.files.files(),
        Command::Encode(a) => a.model.files.files(),
        Command::Decode(a) => a.model.files.files(),
        Command::Serve(a) => a.model.files.files(),
        Command::Check(a) => a.files.files(),
        Command::BenchDit(a) => a.model.files.files(),
        Command::BenchVae(a) => a.model.files.files(),
        _ => return None,
    })
}

pub fn run(a: &QuantizeArgs) -> anyhow::Result<u8> {
    let ck = pipeline::open_checkpoint(&a.model)?;
    pipeline::check_not_checkpoint(&a.out, &ck)?;
    if moss::output::is_stdout(&a.out) {
        anyhow::bail!("--out -: moss quantize writes a file");
    }
    let folder = a.component.replace('-', "_");
    if folder == "text_encoder" && matches!(a.to, checkpoint::quantize::Target::Gguf(_)) {
        anyhow::bail!("--component text-encoder: moss writes the text encoder as int8, int8-convrot, w4a8 or w6a8 (GGUF text encoders name their tensors as llama.cpp does, which moss does not read)");
    }
    let store = TensorStore::open(&ck.loc.root.join(&folder))?;
    let bytes = checkpoint::quantize::write(&store, a.to, &a.out)?;
    if !a.quiet {
        println!("{} ({:.1} MB)", a.out.display(), bytes as f64 / 1e6);
    }
    Ok(0)
}
