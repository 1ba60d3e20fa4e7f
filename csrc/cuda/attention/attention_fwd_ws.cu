// bf16 attention forward on Hopper, warp-specialised as FlashAttention-3 is, head dims 64 and 128:
// attention_wgmma.cu's forward hands its work here wherever TMA can describe q, k and v.
//
// A block is one producer warpgroup and NWG consumer warpgroups of 64 queries each (BM = 64 NWG):
// - the producer's first thread issues every load as TMA: the block's Q tile once, then the K and V
//   tiles of BN keys into a ring of two stages. Each stage's K and each stage's V has a "full"
//   mbarrier (its bytes have landed) and an "empty" one (every consumer is done reading it), so that
//   S = Q K^T starts as soon as K is in, before V;
// - the producer gives most of its registers to the consumers (setmaxnreg);
// - each consumer runs attention_wgmma.cu's loop: S_{j+1} = Q K_{j+1}^T issued together with
//   O += P_j V_j, and the softmax of S_{j+1} while P_j V_j is on the tensor cores. It waits on the
//   stages' mbarriers instead of a block barrier, so the warpgroups drift apart and one's softmax
//   overlaps another's products.
//
// Under a causal mask a consumer may see fewer key tiles than the block loads (its queries are
// earlier); it leaves the last ones without releasing them, which is safe while those are at most
// the two stages the producer never waits on again (static_assert below).
#include <cuda_bf16.h>

#include <type_traits>

#include "attention/attention_tiles.cuh"
#include "attention/attention_wgmma.h"
#include "attention/softmax_wgmma.cuh"
#include "attention/tma_tiles.cuh"
#include "attention/wgmma.cuh"
#include "runtime/common.cuh"
#include "runtime/runtime.h"

namespace engine {
namespace {

using bf16 = __nv_bfloat16;
using namespace attn;
constexpr int kStages = 2;

// grid ceil(T / BM) * B * H (attn::tile_order, heaviest first), (NWG + 1) * 128 threads
template <int D, int NWG, int BN>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
    fwd_ws_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, int rows_inner, bf16* __restrict__ o, float* __restrict__ lse,
                  AttnLayout lo, int H, int Tq, int S, bool causal, float scale2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert((NWG - 1) * 64 <= kStages * BN, "a consumer may leave at most kStages tiles unreleased");
    constexpr int BM = 64 * NWG;
    using PD = Panels<D>;
    constexpr int P = PD::P, W = PD::W;
    constexpr uint32_t kQ = PD::tile_bytes(BM), kKV = PD::tile_bytes(BN);
    extern __shared__ unsigned char smem_raw[];
    const uint32_t sQ = (smem_addr(smem_raw) + 1023) & ~1023u;  // Q (BM, D); K, V [kStages](BN, D), swizzled
    const uint32_t sK = sQ + kQ, sV = sK + kStages * kKV;
    // mbarriers: Q's, then per stage K full, V full, K empty, V empty
    const uint32_t q_full = sV + kStages * kKV;
    auto k_full = [&](int s) { return q_full + 8 + 32 * s; };
    auto v_full = [&](int s) { return q_full + 16 + 32 * s; };
    auto k_empty = [&](int s) { return q_full + 24 + 32 * s; };
    auto v_empty = [&](int s) { return q_full + 32 + 32 * s; };

    const TileOrder at = tile_order((Tq + BM - 1) / BM, H, /*heavy_last=*/true);
    const int bh = at.bh, b = bh / H, h = bh % H, q0 = at.tile * BM, off = S - Tq;
    const int kv_end = causal ? max(0, min(S, min(q0 + BM, Tq) + off)) : S;
    const int ntiles = (kv_end + BN - 1) / BN;
    const int consumers = min(NWG, (Tq - q0 + 63) / 64);  // warpgroups with queries
    // the warpgroup's index through a shuffle, uniform to the compiler (else it serialises the wgmma)
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    if (threadIdx.x == 0) {
        tma::init(q_full, 1);
        for (int s = 0; s < kStages; ++s) {
            tma::init(k_full(s), 1);
            tma::init(v_full(s), 1);
            tma::init(k_empty(s), consumers);
            tma::init(v_empty(s), consumers);
        }
        tma::fence_init();
    }
    __syncthreads();

    if (wg == 0) {  // the producer
        tma::release_registers<RegisterSplit<NWG>::producer>();
        if (threadIdx.x == 0) {
            tma::arrive_expect_tx(q_full, kQ);
            load_rows<P, BM>(sQ, &tq, rows_inner & 1, q_full, q0, h, b);
            for (int j = 0; j < ntiles; ++j) {
                const int s = j % kStages;
                const uint32_t parity = ((j / kStages) & 1) ^ 1;  // the stage's previous use released
                tma::wait(k_empty(s), parity);
                tma::arrive_expect_tx(k_full(s), kKV);
                load_rows<P, BN>(sK + s * kKV, &tk, rows_inner & 2, k_full(s), j * BN, h, b);
                tma::wait(v_empty(s), parity);
                tma::arrive_expect_tx(v_full(s), kKV);
                load_rows<P, BN>(sV + s * kKV, &tv, rows_inner & 4, v_full(s), j * BN, h, b);
            }
        }
        return;
    }

    tma::claim_registers<RegisterSplit<NWG>::consumer>();
    const int c = wg - 1;  // consumer c owns queries q0 + 64 c ..
    if (c >= consumers) return;
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool leader = (threadIdx.x & 127) == 0;  // releases the stages for its warpgroup
    const int wq0 = q0 + c * 64;
    const int wg_tiles = causal ? (max(0, min(S, min(wq0 + 64, Tq) + off)) + BN - 1) / BN : ntiles;
    auto is_full = [&](int tile) {  // wholly inside the visible region for every row of the warpgroup
        return (tile + 1) * BN <= S && (!causal || (tile + 1) * BN - 1 <= wq0 + off);
    };
    auto issue_s = [&](float (&s)[BN / 8][4], int tile, const uint64_t (&desc_q)[P]) {  // S = Q_wg K_tile^T
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const uint64_t desc_k = wgmma::desc(sK + tile % kStages * kKV + p * (BN * 128));
#pragma unroll
            for (int kk = 0; kk < W / 16; ++kk)
                wgmma::mma_ss(s, desc_q[p] + 2 * kk, desc_k + 2 * kk, p > 0 || kk > 0);
        }
        wgmma::commit();
    };

    float acc[D / 8][4];
    float s[BN / 8][4];
    uint32_t pa[BN / 16][4];
    zero(acc);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];  // rows g, g + 8
    const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};
    uint64_t desc_q[P];
#pragma unroll
    for (int p = 0; p < P; ++p) desc_q[p] = wgmma::desc(sQ + p * (BM * 128) + c * 64 * 128);

    tma::wait(q_full, 0);
    if (wg_tiles > 0) {  // S_0 and its softmax
        tma::wait(k_full(0), 0);
        wgmma::fence();
        issue_s(s, 0, desc_q);
        wgmma::wait<0>();
        wgmma::hold(s);
        if (leader) tma::arrive(k_empty(0));
        softmax_step(s, m, l, alpha, is_full(0), 0, S, causal, row, off, t, scale2);
        to_a_frags(pa, s);
    }
    // O += P_it V_it; with `next` (a compile-time flag: no wgmma sits in a branch), also S_{it+1} and its
    // softmax, run while P V is on the tensor cores
    auto step = [&](int it, auto next) {
        if constexpr (next) tma::wait(k_full((it + 1) % kStages), ((it + 1) / kStages) & 1);
        tma::wait(v_full(it % kStages), (it / kStages) & 1);
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {  // the previous tiles' output, rescaled to this tile's max
            acc[j][0] *= alpha[0];
            acc[j][1] *= alpha[0];
            acc[j][2] *= alpha[1];
            acc[j][3] *= alpha[1];
        }
        wgmma::hold(acc);  // the rescale stays before the fence
        wgmma::fence();
        if constexpr (next) issue_s(s, it + 1, desc_q);
        // O_wg (64 x D) += P (64 x BN) V (BN x D), per panel of V; k-steps of 16 keys (16 rows: 2048 bytes)
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const uint64_t desc_v = wgmma::desc(sV + it % kStages * kKV + p * (BN * 128));
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk)
                wgmma::mma_rs_n_major(wgmma::columns<W>(acc, p * W), pa[kk], desc_v + 128 * kk);
        }
        wgmma::commit();
        if constexpr (next) {
            wgmma::wait<1>();
            wgmma::hold(s);
            if (leader) tma::arrive(k_empty((it + 1) % kStages));
            softmax_step(s, m, l, alpha, is_full(it + 1), (it + 1) * BN, S, causal, row, off, t, scale2);
        }
        wgmma::wait<0>();
        wgmma::hold(acc);
        wgmma::hold(pa);
        if (leader) tma::arrive(v_empty(it % kStages));
        if constexpr (next) to_a_frags(pa, s);
    };
    for (int it = 0; it < wg_tiles; ++it) {
        if (it + 1 < wg_tiles) step(it, std::true_type{});  // branches uniform over the warpgroup
        else step(it, std::false_type{});
    }
    store_output<D>(o + b * lo.sb + h * lo.sh, lo.st, lse + (int64_t)bh * Tq, acc, l, m, row, Tq, t);
#else
    __trap();  // built without sm_90a: attention_forward_ws never launches this
#endif
}

template <int D, int NWG, int BN>
bool forward(cudaStream_t st, void* o, float* lse, const void* q, const void* k, const void* v, AttnLayout lq,
             AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, bool causal, float scale) {
    constexpr int BM = 64 * NWG;
    CUtensorMap mq, mk, mv;
    bool rq, rk, rv;
    if (!make_map(&mq, &rq, q, lq, B, H, T, D, BM) || !make_map(&mk, &rk, k, lk, B, H, S, D, BN) ||
        !make_map(&mv, &rv, v, lv, B, H, S, D, BN))
        return false;
    // Q, K and V [kStages]; the mbarriers; slack to align the tiles to 1024 bytes
    const int bytes = (int)Panels<D>::tile_bytes(BM + 2 * kStages * BN) + 8 * (1 + 4 * kStages) + 1024;
    check(cudaFuncSetAttribute(fwd_ws_kernel<D, NWG, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "attention");
    const unsigned grid = (unsigned)(ceil_div(T, BM) * B * H);
    fwd_ws_kernel<D, NWG, BN><<<grid, (NWG + 1) * 128, bytes, st>>>(
        mq, mk, mv, (int)rq | (int)rk << 1 | (int)rv << 2, (bf16*)o, lse, lo, H, T, S, causal, scale * kLog2e);
    return true;
}

}  // namespace

bool attention_forward_ws(int kernel, cudaStream_t st, void* o, float* lse, const void* q, const void* k,
                          const void* v, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H,
                          int T, int S, int D, bool causal, float scale) {
    if (D == 64) {
        switch (kernel) {
            case 1: return forward<64, 2, 128>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
            case 2: return forward<64, 3, 128>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
            case 3: return forward<64, 2, 64>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
            case 4: return forward<64, 3, 64>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
            default: return false;
        }
    }
    if (D == 128) {  // three consumers would spill at 128 columns of output
        switch (kernel) {
            case 1: case 2: return forward<128, 2, 128>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
            case 3: case 4: return forward<128, 2, 64>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
            default: return false;
        }
    }
    return false;
}

}  // namespace engine
