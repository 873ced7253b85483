//! CPU twins of the dit's fused ops.

use super::Cpu;
use crate::backend::ops::DitOps;

impl DitOps for Cpu {}
