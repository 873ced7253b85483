//! Fused ops of the dit (see `crate::model::dit`).

use crate::backend::Backend;

/// Ops the dit needs beyond the generic set.
pub trait DitOps: Backend {}
