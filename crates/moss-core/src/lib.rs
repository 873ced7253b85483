//! moss-core: what must know neither the GPU nor the command line. Tensors, the checkpoint folder
//! and its formats, LoRA adapters, the three networks (text encoder, DiT, VAE) written once over
//! one op set (`backend::Backend` and the per-network traits in `backend::ops`), the readable fp32
//! CPU reference backend, the sampling loop's pieces and the memory planner.

pub mod backend;
pub mod bounded;
pub mod cache;
pub mod checkpoint;
pub mod embeds;
pub mod fp8;
pub mod img2img;
pub mod int8;
pub mod lora;
pub mod model;
pub mod noise;
pub mod options;
pub mod parallel;
pub mod plan;
pub mod prompt;
pub mod sampler;
pub mod sampling;
pub mod schedule;
pub mod sigmas;
pub mod spec;
pub mod tensor;
