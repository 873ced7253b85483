//! Hopper TMA tensor maps (`cuTensorMapEncodeTiled`): the descriptors the sm_90a kernels' bulk
//! copies read (cuda/common/sm90a/tma.cuh).

use super::DType;
use anyhow::{ensure, Result};
use cudarc::driver::sys;

/// A 2-D TMA tensor map (the Hopper kernels: DiT flash attention, the delta rule's state pass):
/// `cols` x `rows` elements of `dt` at `ptr`, row stride `ld` elements, boxes of `bx` elements
/// (128 bytes) x `by` rows, 128-byte swizzle, zeros past the edges.
pub fn tensor_map_2d(ptr: u64, dt: DType, cols: usize, rows: usize, ld: usize, bx: u32, by: u32) -> Result<sys::CUtensorMap> {
    let (ty, es) = match dt {
        DType::BF16 => (sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2),
        DType::F32 => (sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4),
        DType::F8E4M3 => (sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8, 1),
        DType::Q => anyhow::bail!("tensor map of a quantized matrix (dequantize it first)"),
        DType::I8 | DType::I32 => anyhow::bail!("tensor map of an integer tensor"),
    };
    ensure!(
        ptr.is_multiple_of(16) && (ld * es).is_multiple_of(16) && cols <= ld && bx as usize * es == 128,
        "tensor map: address / stride {ld} / {cols} columns / box {bx}"
    );
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims: [u64; 2] = [cols as u64, rows as u64];
    let strides: [u64; 1] = [(ld * es) as u64];
    let boxes: [u32; 2] = [bx, by];
    let elem: [u32; 2] = [1, 1];
    // SAFETY: every pointer is to a local array of the rank the call is told; the map is written only.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            ty,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuTensorMapEncodeTiled: {r:?}");
    Ok(map)
}
