//! moss: text → PNG with the MOSS-Image model. The binary (`main.rs`) parses arguments and turns
//! errors into messages and exit codes; everything else lives here and returns errors.

pub mod backend;
pub mod batch;
pub mod bench;
pub mod bounded;
pub mod bench_encoder;
pub mod bench_vae;
pub mod check;
pub mod checkpoint;
pub mod cli;
pub mod embeds;
pub mod fp8;
pub mod lora;
pub mod memory_plan;
pub mod metadata;
pub mod model;
pub mod noise;
pub mod options;
pub mod output;
pub mod picture;
pub mod picture_in;
pub mod pipeline;
pub mod png;
pub mod prompt;
pub mod run_plan;
pub mod sampling;
pub mod schedule;
pub mod serve;
pub mod tensor;
