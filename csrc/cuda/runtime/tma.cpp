#include "runtime/tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

namespace engine {
namespace tma {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess) {
            cudaGetLastError();  // not sticky: leave no error for the next launch to report
            return (PFN_cuTensorMapEncodeTiled_v12000) nullptr;
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// `bytes` a element: 2 (bf16) or 4 (float32)
bool encode(CUtensorMapDataType type, uint64_t bytes, CUtensorMap* map, const void* base, int rank,
            const uint64_t* dims, const uint64_t* strides, const uint32_t* box) {
    const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
    if (fn == nullptr || rank < 1 || rank > 5) return false;
    cuuint64_t d[5], s[4];
    cuuint32_t b[5], one[5] = {1, 1, 1, 1, 1};
    for (int i = 0; i < rank; ++i) {
        d[i] = dims[i];
        b[i] = box[i];
        if (i > 0) s[i - 1] = strides[i - 1];
        if (i > 0 && strides[i - 1] < (i == 1 ? dims[0] * bytes : strides[i - 2] * dims[i - 1])) return false;
    }
    CUtensorMap out;
    if (fn(&out, type, (cuuint32_t)rank, const_cast<void*>(base), d, s, b, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
        CUDA_SUCCESS)
        return false;
    *map = out;
    return true;
}

}  // namespace

bool encode_bf16(CUtensorMap* map, const void* base, int rank, const uint64_t* dims, const uint64_t* strides, const uint32_t* box) {
    return encode(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, map, base, rank, dims, strides, box);
}

bool encode_f32(CUtensorMap* map, const void* base, int rank, const uint64_t* dims, const uint64_t* strides, const uint32_t* box) {
    return encode(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, map, base, rank, dims, strides, box);
}

}  // namespace tma
}  // namespace engine
