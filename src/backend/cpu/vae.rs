//! CPU twins of the vae's fused ops.

use super::Cpu;
use crate::backend::ops::VaeOps;

impl VaeOps for Cpu {}
