//! The three networks, each written once against the backend op set.

pub mod dit;
pub mod encoder;
pub mod stream;
pub mod vae;
