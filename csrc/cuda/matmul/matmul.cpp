// Matrix multiplication through cuBLASLt (row-major, batched, transposes; TF32 for float32; bf16 with
// float32 accumulation, written out as bf16 or, with out_dtype F32, as float32: the weight gradient of
// float32 master weights under autocast, without a bf16 copy and a cast; FP8 (matmul_fp8), E4M3 and
// E5M2 operands both K-major with their dequantisation scales on the device, bf16 or float32 out).
//
// Row-major C (M, N) = A (M, K) B (K, N) is column-major C^T (N, M) = B^T (N, K) A^T (K, M), so
// cuBLASLt is called with the operands swapped: its "A" is our b and its "B" is our a. Plans
// (descriptors + the heuristic's algorithm) are cached per shape and epilogue, so a training step
// does no heuristic queries after its first iteration.
//
// Autotuning (ENGINE_MATMUL_AUTOTUNE): the heuristic proposes up to kCandidates algorithms; the first
// call of a plan outside a CUDA-graph capture times each on the call's own operands and keeps the
// fastest where it beats the heuristic's first choice by more than 2% (so that noise does not pick).
// `epilogue` (the default) tunes the bf16 and FP8 plans with an epilogue (the heuristic's choice for
// DGELU at gpt2_124m's MLP is 6-10% slower than its best), 1 every plan, 0 none. Tuning is timing, so
// two processes may choose differently and round differently; 0 gives the same algorithms every run.
// ENGINE_MATMUL_AUTOTUNE_LOG=1 prints each tuned plan's timings.
//
// Epilogues fold the Linear layer's bias and GELU into the GEMM (no extra pass over the output):
// BIAS c = a b + bias; GELU_BIAS c = gelu(a b + bias) with the pre-activation written to aux (the
// backward's input); BGRAD c = a b and bias = row sums of op(a) (the bias gradient, from the weight
// gradient's GEMM); DGELU c = gelu'(aux) * (a b), aux the GELU's input (the GELU's backward in the dx
// GEMM of the layer after it, engine/ops/mlp.py). In cuBLAS terms our output columns are its rows, so
// our bias (N,) is its per-row bias (EPILOGUE_BIAS), and our op(a)'s rows are its B's columns
// (EPILOGUE_BGRADB). The bias (and its gradient) is of the output's dtype: cuBLASLt (13.x, H200)
// refuses a float32 bias beside a bf16 output, so autocast's float32 master bias is cast for the forward.
#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "copy/copy.h"  // fill
#include "matmul/matmul.h"
#include "runtime/graph.h"  // capture_scratch

namespace engine {
namespace {

bool g_allow_tf32 = true;

void check_lt(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        throw CudaError(std::string("engine op 'matmul': cuBLASLt ") + what + " failed: " + cublasLtGetStatusName(s) +
                        " (" + cublasLtGetStatusString(s) + ")");
}

// the operand types of FP8 GEMMs in a Key (after the DType codes, which name no FP8 type)
constexpr int kE4M3 = 100, kE5M2 = 101;

struct Key {
    int dtype, out_dtype, tf32, ta, tb, align_a, align_b, align_c, epilogue;
    int dtype_b, fast_accum;  // FP8: b's type (a's is dtype) and cuBLASLt's fast accumulation; 0 otherwise
    int64_t batch, M, N, K, sa, sb, sc;
    bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};
struct KeyHash {
    std::size_t operator()(const Key& k) const {
        const unsigned char* p = reinterpret_cast<const unsigned char*>(&k);
        std::size_t h = 1469598103934665603ull;
        for (std::size_t i = 0; i < sizeof(Key); ++i) h = (h ^ p[i]) * 1099511628211ull;
        return h;
    }
};

constexpr int kCandidates = 16;

struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's proposals, its best guess first
    std::vector<std::size_t> candidate_workspace;  // the workspace bytes each needs
    cublasLtMatmulAlgo_t algo;                     // the one in use: candidates[0] until tuned
    std::size_t workspace = 0;                     // the bytes of workspace `algo` needs
    bool found = false;  // false: cuBLASLt has no algorithm for this epilogue (the caller runs it unfused)
    bool tuned = false;  // timed, or not to be
    Key key;             // what it is for (the autotuning log)
};

// ENGINE_MATMUL_AUTOTUNE: 0 none, 1 every plan, epilogue (the default, also when unset or empty) the
// plans with an epilogue. Any other value is an error, raised by the first matmul.
int autotune_mode() {
    static const int mode = [] {
        const char* v = std::getenv("ENGINE_MATMUL_AUTOTUNE");
        if (v == nullptr || *v == 0 || std::strcmp(v, "epilogue") == 0) return 2;
        if (std::strcmp(v, "0") == 0) return 0;
        if (std::strcmp(v, "1") == 0) return 1;
        throw std::invalid_argument(std::string("ENGINE_MATMUL_AUTOTUNE='") + v +
                                    "' is not a setting: use 0 (tune no plan), 1 (every plan) or epilogue "
                                    "(the plans with an epilogue; the default)");
    }();
    return mode;
}

cublasLtEpilogue_t lt_epilogue(int e) {
    switch (e) {
        case EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
        case EPI_GELU_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        case EPI_GELU: return CUBLASLT_EPILOGUE_GELU_AUX;
        case EPI_BGRAD: return CUBLASLT_EPILOGUE_BGRADB;
        case EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
        default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

struct DeviceLt {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    std::size_t workspace_bytes = 32u << 20;  // 32 MiB, as recommended for Hopper
    std::unordered_map<Key, Plan, KeyHash> plans;
};

std::mutex g_mutex;
DeviceLt g_lt[64];

DeviceLt& lt(int device) {
    DeviceLt& d = g_lt[device];
    if (d.handle == nullptr) {
        check_lt(cublasLtCreate(&d.handle), "create");
        check(cudaMalloc(&d.workspace, d.workspace_bytes), "matmul workspace");
    }
    return d;
}

int alignment(const void* p) {
    auto v = reinterpret_cast<std::uintptr_t>(p);
    int a = 256;
    while (a > 1 && (v % a) != 0) a >>= 1;
    return a;
}

void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
    int32_t b = (int32_t)batch;
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)), "layout");
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
             "layout");
}

cudaDataType_t lt_type(int dtype) {
    switch (dtype) {
        case F64: return CUDA_R_64F;
        case BF16: return CUDA_R_16BF;
        case kE4M3: return CUDA_R_8F_E4M3;
        case kE5M2: return CUDA_R_8F_E5M2;
        default: return CUDA_R_32F;
    }
}
bool is_fp8(int dtype) { return dtype == kE4M3 || dtype == kE5M2; }

Plan make_plan(DeviceLt& d, const Key& k) {
    const int mode = autotune_mode();  // first: an unknown setting throws before anything is created
    Plan p;
    p.key = k;
    bool f64 = k.dtype == F64;
    // bf16: bf16 operands, float32 accumulation and scaling, a bf16 or float32 result
    // FP8: a and b of their own FP8 types (dtype, dtype_b), float32 accumulation, a bf16 result
    const bool fp8 = is_fp8(k.dtype);
    cudaDataType_t dt = lt_type(k.dtype), dt_b = fp8 ? lt_type(k.dtype_b) : dt, out_t = lt_type(k.out_dtype);
    cudaDataType_t scale_t = f64 ? CUDA_R_64F : CUDA_R_32F;
    cublasComputeType_t ct = f64 ? CUBLAS_COMPUTE_64F : (k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
    check_lt(cublasLtMatmulDescCreate(&p.op, ct, scale_t), "matmul desc");
    // cuBLAS "A" = our b, cuBLAS "B" = our a (see the header comment)
    cublasOperation_t opA = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)), "matmul desc");
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)), "matmul desc");
    if (fp8) {
        int8_t fast = (int8_t)k.fast_accum;
        check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)), "fp8");
    }
    if (k.epilogue != EPI_NONE) {
        cublasLtEpilogue_t epi = lt_epilogue(k.epilogue);
        check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "epilogue");
        cudaDataType_t bias_t = out_t;  // bias (and its gradient) in the output's type
        check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof(bias_t)),
                 "epilogue");
        if (k.epilogue == EPI_GELU_BIAS || k.epilogue == EPI_GELU || k.epilogue == EPI_DGELU) {
            int64_t aux_ld = k.N;  // aux is (M, N) row-major like c
            check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
                     "epilogue");
            if (fp8)  // the pre-activation in the output's type (bf16), not FP8
                check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &out_t,
                                                        sizeof(out_t)),
                         "epilogue");
        }
    }
    // our b: (K, N) row-major = (N, K) col-major, ld N; transposed: (N, K) row-major = (K, N) col-major, ld K
    if (!k.tb) check_lt(cublasLtMatrixLayoutCreate(&p.la, dt_b, k.N, k.K, k.N), "layout");
    else check_lt(cublasLtMatrixLayoutCreate(&p.la, dt_b, k.K, k.N, k.K), "layout");
    // our a: (M, K) row-major = (K, M) col-major, ld K; transposed: (K, M) row-major = (M, K) col-major, ld M
    if (!k.ta) check_lt(cublasLtMatrixLayoutCreate(&p.lb, dt, k.K, k.M, k.K), "layout");
    else check_lt(cublasLtMatrixLayoutCreate(&p.lb, dt, k.M, k.K, k.M), "layout");
    check_lt(cublasLtMatrixLayoutCreate(&p.lc, out_t, k.N, k.M, k.N), "layout");
    if (k.batch > 1) {
        set_batch(p.la, k.batch, k.sb);
        set_batch(p.lb, k.batch, k.sa);
        set_batch(p.lc, k.batch, k.sc);
    }
    cublasLtMatmulPreference_t pref;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &d.workspace_bytes,
                                                  sizeof(d.workspace_bytes)),
             "preference");
    uint32_t aa = k.align_b, ab = k.align_a, ac = k.align_c;  // swapped like the operands
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
    cublasLtMatmulHeuristicResult_t results[kCandidates];
    int found = 0;
    const bool tune = mode == 1 || (mode == 2 && k.epilogue != EPI_NONE && (k.dtype == BF16 || fp8));
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(d.handle, p.op, p.la, p.lb, p.lc, p.lc, pref,
                                                      tune ? kCandidates : 1, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if ((fp8 || k.epilogue != EPI_NONE) && (s != CUBLAS_STATUS_SUCCESS || found == 0)) return p;  // the caller's fallback
    check_lt(s, "heuristic");
    if (found == 0)
        throw CudaError("engine op 'matmul': cuBLASLt found no algorithm for M=" + std::to_string(k.M) +
                        " N=" + std::to_string(k.N) + " K=" + std::to_string(k.K) + " batch=" + std::to_string(k.batch));
    for (int i = 0; i < found; ++i)
        if (results[i].state == CUBLAS_STATUS_SUCCESS) {
            p.candidates.push_back(results[i].algo);
            p.candidate_workspace.push_back(results[i].workspaceSize);
        }
    p.algo = p.candidates.empty() ? results[0].algo : p.candidates[0];
    p.workspace = p.candidates.empty() ? results[0].workspaceSize : p.candidate_workspace[0];
    p.found = true;
    p.tuned = p.candidates.size() < 2;
    return p;
}

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

namespace {

// the cached plan for one call (creating it on first use); the caller holds g_mutex
Plan& plan_for(DeviceLt& d, int dtype, int out_dtype, int epilogue, void* c, const void* a, const void* b,
               int64_t batch, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, int64_t stride_a,
               int64_t stride_b, int64_t stride_c, int dtype_b = 0, bool fast_accum = false) {
    Key k;
    std::memset(&k, 0, sizeof(k));
    k.dtype_b = dtype_b;
    k.fast_accum = fast_accum;
    k.dtype = dtype;
    k.out_dtype = out_dtype;
    k.tf32 = dtype == F32 && g_allow_tf32;
    k.ta = trans_a;
    k.tb = trans_b;
    k.align_a = alignment(a);
    k.align_b = alignment(b);
    k.align_c = alignment(c);
    k.epilogue = epilogue;
    k.batch = batch;
    k.M = M;
    k.N = N;
    k.K = K;
    k.sa = batch > 1 ? stride_a : 0;
    k.sb = batch > 1 ? stride_b : 0;
    k.sc = batch > 1 ? stride_c : 0;
    auto it = d.plans.find(k);
    if (it == d.plans.end()) it = d.plans.emplace(k, make_plan(d, k)).first;
    return it->second;
}

// one cuBLASLt call with `algo` on `workspace` (workspace_bytes of it)
cublasStatus_t launch(DeviceLt& d, const Plan& p, const cublasLtMatmulAlgo_t& algo, int dtype, void* c,
                      const void* a, const void* b, cudaStream_t st, void* workspace, std::size_t workspace_bytes) {
    double one64 = 1.0, zero64 = 0.0;
    float one32 = 1.f, zero32 = 0.f;
    const void* alpha = dtype == F64 ? (const void*)&one64 : (const void*)&one32;
    const void* beta = dtype == F64 ? (const void*)&zero64 : (const void*)&zero32;
    return cublasLtMatmul(d.handle, p.op, alpha, b, p.la, a, p.lb, beta, c, p.lc, c, p.lc, &algo, workspace,
                          workspace_bytes, st);
}

int algo_id(const cublasLtMatmulAlgo_t& algo) {
    int id = -1;
    std::size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
    return id;
}

// Time every candidate on this call's operands and keep the fastest (if 2% faster than the heuristic's
// first choice; the header comment says why). beta is 0, so c and an epilogue's bias / aux output are
// only written (never read), and the real call that follows writes them again.
void tune(DeviceLt& d, Plan& p, int dtype, void* c, const void* a, const void* b, cudaStream_t st) {
    static const bool log = [] {
        const char* v = std::getenv("ENGINE_MATMUL_AUTOTUNE_LOG");
        return v != nullptr && v[0] == '1';
    }();
    const Key& k = p.key;
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "matmul autotune");
    check(cudaEventCreate(&stop), "matmul autotune");
    constexpr int reps = 5;
    float best = -1.f, first = -1.f;
    std::size_t best_i = 0;
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
        if (launch(d, p, p.candidates[i], dtype, c, a, b, st, d.workspace, d.workspace_bytes) != CUBLAS_STATUS_SUCCESS)
            continue;  // warm-up
        check(cudaEventRecord(start, st), "matmul autotune");
        for (int r = 0; r < reps; ++r) launch(d, p, p.candidates[i], dtype, c, a, b, st, d.workspace, d.workspace_bytes);
        check(cudaEventRecord(stop, st), "matmul autotune");
        check(cudaEventSynchronize(stop), "matmul autotune");
        float ms = 0.f;
        check(cudaEventElapsedTime(&ms, start, stop), "matmul autotune");
        if (i == 0) first = ms;
        if (best < 0.f || ms < best) best = ms, best_i = i;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    check_launch("matmul autotune");
    const bool faster = best >= 0.f && (first < 0.f || best < 0.98f * first);
    if (faster) p.algo = p.candidates[best_i], p.workspace = p.candidate_workspace[best_i];
    if (log)
        std::fprintf(stderr,
                     "engine matmul autotune M=%lld N=%lld K=%lld ta=%d tb=%d epilogue=%d dtype=%d: heuristic's "
                     "choice %.1f us (algo %d), fastest %.1f us (candidate %zu of %zu, algo %d): using candidate %zu\n",
                     (long long)k.M, (long long)k.N, (long long)k.K, k.ta, k.tb, k.epilogue, k.dtype,
                     1000.f * first / reps, algo_id(p.candidates[0]), 1000.f * best / reps, best_i,
                     p.candidates.size(), algo_id(p.candidates[best_i]), faster ? best_i : 0);
}

// Eager calls share the device's workspace. In a graph capture each call gets a workspace of its own
// (capture_scratch, runtime/graph.h) where one is free: the zeroing cuBLASLt queues before a Hopper
// "coop" GEMM then touches memory no other node uses, and the graph does all of them in one node at its
// start instead of one memset node before each GEMM.
void run_plan(DeviceLt& d, Plan& p, int device, int dtype, void* c, const void* a, const void* b) {
    cudaStream_t st = stream(device);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(st, &capture), "matmul");
    const bool capturing = capture != cudaStreamCaptureStatusNone;
    if (!p.tuned && !capturing) {  // a graph being captured keeps the current choice
        tune(d, p, dtype, c, a, b, st);
        p.tuned = true;
    }
    void* workspace = d.workspace;
    std::size_t workspace_bytes = d.workspace_bytes;
    if (capturing && p.workspace > 0) {
        if (void* own = capture_scratch(device, p.workspace)) workspace = own, workspace_bytes = p.workspace;
    }
    check_lt(launch(d, p, p.algo, dtype, c, a, b, st, workspace, workspace_bytes), "matmul");
    check_launch("matmul");
}

// this call's bias (BIAS, GELU_BIAS; written by BGRAD) and aux (GELU_BIAS, GELU) on the cached plan
void set_epilogue_pointers(const Plan& p, int epilogue, void* bias, void* aux) {
    if (epilogue == EPI_BIAS || epilogue == EPI_GELU_BIAS || epilogue == EPI_BGRAD)
        check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                 "epilogue");
    if (epilogue == EPI_GELU_BIAS || epilogue == EPI_GELU || epilogue == EPI_DGELU)
        check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)),
                 "epilogue");
}

// out_dtype -1 is dtype; otherwise dtype itself, or F32 for BF16 operands
int checked_out_dtype(const char* op, int dtype, int out_dtype) {
    if (out_dtype < 0 || out_dtype == dtype) return dtype;
    if (dtype == BF16 && out_dtype == F32) return out_dtype;
    throw std::invalid_argument(std::string("engine op '") + op + "': a " + dtype_name(dtype) + " GEMM cannot write " +
                                dtype_name(out_dtype) + " (out_dtype is the operands' dtype, or float32 for bfloat16 "
                                "operands)");
}

}  // namespace

void matmul(int device, int dtype, void* c, const void* a, const void* b, int64_t batch, int64_t M, int64_t N,
            int64_t K, bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b, int64_t stride_c,
            int out_dtype) {
    if (dtype != F32 && dtype != F64 && dtype != BF16) unsupported("matmul", dtype);
    out_dtype = checked_out_dtype("matmul", dtype, out_dtype);
    if (batch == 0 || M == 0 || N == 0) return;
    use_device(device);
    if (K == 0) {
        fill(device, out_dtype, c, 0.0, batch * M * N);
        return;
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    DeviceLt& d = lt(device);
    Plan& p = plan_for(d, dtype, out_dtype, EPI_NONE, c, a, b, batch, M, N, K, trans_a, trans_b, stride_a,
                             stride_b, stride_c);
    run_plan(d, p, device, dtype, c, a, b);
}

bool matmul_epilogue(int device, int dtype, int epilogue, void* c, const void* a, const void* b, int64_t M, int64_t N,
                     int64_t K, bool trans_a, bool trans_b, void* bias, void* aux, int out_dtype) {
    if (dtype != F32 && dtype != BF16) return false;
    out_dtype = checked_out_dtype("matmul_epilogue", dtype, out_dtype);
    if (M == 0 || N == 0 || K == 0) return false;
    if (epilogue < EPI_BIAS || epilogue > EPI_DGELU) throw std::invalid_argument("matmul_epilogue: unknown epilogue");
    const bool with_aux = epilogue == EPI_GELU_BIAS || epilogue == EPI_GELU || epilogue == EPI_DGELU;
    if (with_aux && (aux == nullptr || N % 8 != 0)) return false;
    use_device(device);
    std::lock_guard<std::mutex> lock(g_mutex);
    DeviceLt& d = lt(device);
    Plan& p = plan_for(d, dtype, out_dtype, epilogue, c, a, b, 1, M, N, K, trans_a, trans_b, 0, 0, 0);
    if (!p.found) return false;
    set_epilogue_pointers(p, epilogue, bias, aux);
    run_plan(d, p, device, dtype, c, a, b);
    return true;
}

bool matmul_fp8(int device, int epilogue, void* c, const void* a, const void* b, int a_format, int b_format,
                const float* a_inv_scale, const float* b_inv_scale, int64_t M, int64_t N, int64_t K, void* bias,
                void* aux, bool fast_accum, int out_dtype) {
    if (out_dtype < 0) out_dtype = BF16;
    if (out_dtype != BF16 && out_dtype != F32)
        throw std::invalid_argument("engine op 'matmul_fp8': out_dtype must be bfloat16 or float32");
    if (out_dtype == F32 && epilogue != EPI_NONE)
        throw std::invalid_argument("engine op 'matmul_fp8': a float32 result takes no epilogue");
    auto code = [](int format) {
        if (format != 0 && format != 1)
            throw std::invalid_argument("engine op 'matmul_fp8': format must be 0 (E4M3) or 1 (E5M2)");
        return format == 0 ? kE4M3 : kE5M2;
    };
    const int ta = code(a_format), tb = code(b_format);
    if (ta == kE5M2 && tb == kE5M2) return false;  // Hopper has no E5M2 x E5M2 GEMM
    if (epilogue < EPI_NONE || epilogue > EPI_GELU || epilogue == EPI_BGRAD)
        throw std::invalid_argument("engine op 'matmul_fp8': epilogue must be none, bias, gelu_bias or gelu");
    if (M == 0 || N == 0 || K == 0) return false;
    if ((epilogue == EPI_GELU_BIAS || epilogue == EPI_GELU) && (aux == nullptr || N % 8 != 0)) return false;
    use_device(device);
    std::lock_guard<std::mutex> lock(g_mutex);
    DeviceLt& d = lt(device);
    // both operands K-major (Hopper's FP8 GEMM takes no other layout): a (M, K), b (N, K) transposed
    Plan& p = plan_for(d, ta, out_dtype, epilogue, c, a, b, 1, M, N, K, false, true, 0, 0, 0, tb, fast_accum);
    if (!p.found) return false;
    // cuBLAS's A is our b (the header comment), so its A scale is b's
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_inv_scale,
                                            sizeof(b_inv_scale)),
             "fp8 scale");
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_inv_scale,
                                            sizeof(a_inv_scale)),
             "fp8 scale");
    set_epilogue_pointers(p, epilogue, bias, aux);
    run_plan(d, p, device, F32, c, a, b);
    return true;
}

}  // namespace engine
