//! CPU twins of the encoder's fused ops.

use super::Cpu;
use crate::backend::ops::EncoderOps;

impl EncoderOps for Cpu {}
