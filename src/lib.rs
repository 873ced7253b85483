//! moss: text → picture with the MOSS-Image model. The binary (`main.rs`) parses arguments and
//! turns errors into messages and exit codes; this library is the front end over the two lower
//! crates: `moss-core` (the model, the CPU reference, formats, planning; no GPU, no command line)
//! and `moss-cuda` (the CUDA backend). The compiler keeps the edges one way: neither lower crate
//! can name anything here.

pub use moss_core::{
    bounded, cache, checkpoint, embeds, fp8, img2img, lora, model, noise, options, parallel, plan, prompt, sampler, sampling, schedule, sigmas, spec, tensor,
};

/// The op set and its CPU reference (`moss-core`), and the CUDA backend (`moss-cuda`).
pub mod backend {
    pub use moss_core::backend::*;
    pub use moss_cuda as cuda;

    /// The CPU's budget: no device memory, planned only under an explicit `--max-vram`, with the
    /// CUDA backend's activation formulas (a rehearsal of the GPU's plan without a GPU).
    pub fn cpu_budget() -> crate::plan::Budget {
        crate::plan::Budget::cpu(&cuda::plan::ACTIVATIONS)
    }
}

pub mod a1111;
pub mod batch;
pub mod c2pa_manifest;
pub mod check;
pub mod metadata;
pub mod output;
pub mod picture;
pub mod picture_in;
pub mod pipeline;
pub mod png;
pub mod provenance;
pub mod serve;
