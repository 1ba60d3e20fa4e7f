// bf16 attention backward on Hopper, warp-specialised, head dims 64 and 128: attention_wgmma.cu's
// backward hands its work here wherever TMA can describe q, k, v and dout.
//
// A block is one producer warpgroup and NWG consumer warpgroups of 64 keys each (the block owns
// BKB = 64 NWG keys):
// - the producer's first thread loads the block's K and V once, then walks the query tiles of 64
//   that see its keys, loading each tile's Q and dO by TMA into a ring of two stages (a "full" and
//   an "empty" mbarrier each), so that the consumers share every Q and dO tile instead of each
//   loading its own;
//   and its second warp stages the tile's lse (log2 domain) and delta beside them, each lane arriving
//   on the same "full" barrier;
// - each consumer runs attention_wgmma.cu's iteration on its 64 keys (S^T, dP^T; P^T, dS^T in
//   registers; dV, dK, and dQ = dS K added into dq_acc by atomics), synchronising only within its
//   warpgroup (a named barrier), so the warpgroups drift apart and one's elementwise step overlaps
//   another's products.
//
// Under a causal mask a later consumer's keys see fewer query tiles (its first tiles are masked out
// entirely): it waits for those tiles and releases them without computing, which keeps every
// mbarrier phase in step.
#include <cuda_bf16.h>

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
constexpr int kStages = 2, BRB = 64;  // query tiles of 64 rows

// grid ceil(S / BKB) * B * H (attn::tile_order, heaviest key tile first), (NWG + 1) * 128 threads
template <int D, int NWG>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
    bwd_ws_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo, int rows_inner,
                  bf16* __restrict__ dk, bf16* __restrict__ dv, float* __restrict__ dq_acc,
                  const float* __restrict__ lse, const float* __restrict__ delta, AttnLayout lk, AttnLayout lv, int H,
                  int Tq, int S, bool causal, float scale, float scale2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BKB = 64 * NWG;
    using PD = Panels<D>;
    constexpr int P = PD::P, W = PD::W;
    constexpr uint32_t kKeys = PD::tile_bytes(BKB), kTile = PD::tile_bytes(BRB), kPanel = 64 * 128;
    extern __shared__ unsigned char smem_raw[];
    // K, V (BKB, D); Q, dO [kStages](64, D); dS^T (64, 64) a consumer; lse, delta [kStages][64]; the mbarriers
    const uint32_t sK = (smem_addr(smem_raw) + 1023) & ~1023u, sV = sK + kKeys;
    const uint32_t sQ = sV + kKeys, sdO = sQ + kStages * kTile, sdS0 = sdO + kStages * kTile;
    float* sLse = reinterpret_cast<float*>(smem_raw + (sdS0 + NWG * kPanel - smem_addr(smem_raw)));
    float* sDelta = sLse + kStages * BRB;
    const uint32_t kv_full = smem_addr(sDelta + kStages * BRB);
    auto full = [&](int s) { return kv_full + 8 + 16 * s; };
    auto empty = [&](int s) { return kv_full + 16 + 16 * s; };

    const TileOrder at = tile_order((S + BKB - 1) / BKB, H, /*heavy_last=*/false);
    const int bh = at.bh, b = bh / H, h = bh % H, k0 = at.tile * BKB, off = S - Tq;
    const int i_begin = causal ? max(0, k0 - off) / BRB * BRB : 0;  // the first query tile any consumer sees
    const int ntiles = Tq > i_begin ? (Tq - i_begin + BRB - 1) / BRB : 0;
    const int consumers = min(NWG, (S - k0 + 63) / 64);  // warpgroups with keys
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    if (threadIdx.x == 0) {
        tma::init(kv_full, 1);
        for (int s = 0; s < kStages; ++s) {
            tma::init(full(s), 1 + 32);  // the TMA thread's arrival, and the lse / delta warp's lanes
            tma::init(empty(s), consumers);
        }
        tma::fence_init();
    }
    __syncthreads();

    if (wg == 0) {  // the producer
        tma::release_registers<RegisterSplit<NWG>::producer>();
        if (threadIdx.x == 0) {
            tma::arrive_expect_tx(kv_full, 2 * kKeys);
            load_rows<P, BKB>(sK, &tk, rows_inner & 2, kv_full, k0, h, b);
            load_rows<P, BKB>(sV, &tv, rows_inner & 4, kv_full, k0, h, b);
            for (int j = 0; j < ntiles; ++j) {
                const int s = j % kStages, i0 = i_begin + j * BRB;
                tma::wait(empty(s), ((j / kStages) & 1) ^ 1);  // the stage's previous tile released
                tma::arrive_expect_tx(full(s), 2 * kTile);
                load_rows<P, BRB>(sQ + s * kTile, &tq, rows_inner & 1, full(s), i0, h, b);
                load_rows<P, BRB>(sdO + s * kTile, &tdo, rows_inner & 8, full(s), i0, h, b);
            }
        } else if (threadIdx.x >> 5 == 1) {
            const int lane = threadIdx.x & 31;
            for (int j = 0; j < ntiles; ++j) {
                const int s = j % kStages, i0 = i_begin + j * BRB;
                tma::wait(empty(s), ((j / kStages) & 1) ^ 1);
                for (int i = lane; i < BRB; i += 32) {  // +inf past Tq or where the query saw no key: P = 0
                    const bool ok = i0 + i < Tq;
                    const float v = ok ? lse[(int64_t)bh * Tq + i0 + i] : INFINITY;
                    sLse[s * BRB + i] = v == -INFINITY ? INFINITY : v * kLog2e;
                    sDelta[s * BRB + i] = ok ? delta[(int64_t)bh * Tq + i0 + i] : 0.f;
                }
                tma::arrive(full(s));
            }
        }
        return;
    }

    tma::claim_registers<RegisterSplit<NWG>::consumer>();
    const int c = wg - 1;  // consumer c owns keys kc0 .. kc0 + 63
    if (c >= consumers) return;
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool leader = (threadIdx.x & 127) == 0;
    const int kc0 = k0 + 64 * c;
    // query tiles this consumer skips: wholly before its first visible query
    const int skip = causal ? (max(0, kc0 - off) / BRB * BRB - i_begin) / BRB : 0;
    const uint32_t sdS = sdS0 + c * kPanel;
    unsigned char* sdS_ptr = smem_raw + (sdS - smem_addr(smem_raw));
    float* dq_bh = dq_acc + (int64_t)bh * Tq * D;
    auto wg_sync = [&] { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory"); };

    float dk_acc[D / 8][4], dv_acc[D / 8][4];
    zero(dk_acc);
    zero(dv_acc);
    const int key[2] = {kc0 + warp * 16 + g, kc0 + warp * 16 + g + 8};
    const uint64_t desc_ds = wgmma::desc(sdS);
    uint64_t desc_k[P], desc_v[P];  // this consumer's 64 rows of each panel
#pragma unroll
    for (int p = 0; p < P; ++p)
        desc_k[p] = wgmma::desc(sK + p * (BKB * 128) + c * kPanel),
        desc_v[p] = wgmma::desc(sV + p * (BKB * 128) + c * kPanel);

    tma::wait(kv_full, 0);
    for (int j = 0; j < ntiles; ++j) {
        const int s = j % kStages, i0 = i_begin + j * BRB;
        tma::wait(full(s), (j / kStages) & 1);
        if (j < skip) {  // no query of this tile sees these keys
            if (leader) tma::arrive(empty(s));
            continue;
        }
        uint64_t desc_q[P], desc_do[P];
#pragma unroll
        for (int p = 0; p < P; ++p)
            desc_q[p] = wgmma::desc(sQ + s * kTile + p * kPanel), desc_do[p] = wgmma::desc(sdO + s * kTile + p * kPanel);
        // S^T = K Q^T, dP^T = V dO^T (64 keys x 64 queries each)
        float st[8][4], dpt[8][4];
        wgmma::fence();
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
            for (int kk = 0; kk < W / 16; ++kk) wgmma::mma_ss(st, desc_k[p] + 2 * kk, desc_q[p] + 2 * kk, p > 0 || kk > 0);
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
            for (int kk = 0; kk < W / 16; ++kk)
                wgmma::mma_ss(dpt, desc_v[p] + 2 * kk, desc_do[p] + 2 * kk, p > 0 || kk > 0);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::hold(st);
        wgmma::hold(dpt);
        // P^T = 2^(S^T scale2 - lse2), dS^T = P^T (dP^T - delta); dS^T also to shared memory (swizzled
        // (keys, queries)) for dQ. Tiles wholly inside the visible region skip the mask.
        const bool full_tile = kc0 + 64 <= S && (!causal || kc0 + 64 - 1 <= i0 + off);
        uint32_t pa[4][4], dsa[4][4];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const float2 lse2 = *reinterpret_cast<const float2*>(sLse + s * BRB + jj * 8 + 2 * t);  // columns jj 8 + 2 t, + 1
            const float2 delta2 = *reinterpret_cast<const float2*>(sDelta + s * BRB + jj * 8 + 2 * t);
            float p[4], ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                p[e] = ex2(fmaf(st[jj][e], scale2, -(e & 1 ? lse2.y : lse2.x)));
                if (!full_tile) {
                    const int qi = i0 + jj * 8 + 2 * t + (e & 1), kr = key[e >> 1];
                    if (kr >= S || (causal && kr > qi + off)) p[e] = 0.f;
                }
                ds[e] = p[e] * (dpt[jj][e] - (e & 1 ? delta2.y : delta2.x));
            }
            pa[jj >> 1][(jj & 1) * 2] = pack_bf16(p[0], p[1]);
            pa[jj >> 1][(jj & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
            dsa[jj >> 1][(jj & 1) * 2] = pack_bf16(ds[0], ds[1]);
            dsa[jj >> 1][(jj & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
            const int r0 = warp * 16 + g;  // rows r0 and r0 + 8 of dS^T; columns jj * 8 + 2 t, + 1
            *reinterpret_cast<uint32_t*>(sdS_ptr + wgmma::swizzled(r0, jj) + 4 * t) = dsa[jj >> 1][(jj & 1) * 2];
            *reinterpret_cast<uint32_t*>(sdS_ptr + wgmma::swizzled(r0 + 8, jj) + 4 * t) =
                dsa[jj >> 1][(jj & 1) * 2 + 1];
        }
        // dV += P^T dO;  dK += dS^T Q  (scale applied at the end); k-steps of 16 queries
        wgmma::fence();
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
            for (int kk = 0; kk < BRB / 16; ++kk)
                wgmma::mma_rs_n_major(wgmma::columns<W>(dv_acc, p * W), pa[kk], desc_do[p] + 128 * kk);
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
            for (int kk = 0; kk < BRB / 16; ++kk)
                wgmma::mma_rs_n_major(wgmma::columns<W>(dk_acc, p * W), dsa[kk], desc_q[p] + 128 * kk);
        wgmma::commit();
        wgmma::fence_smem();  // dS^T's stores, before the warpgroup's wgmma reads them
        wg_sync();
        // dQ (64 queries x D) = dS (queries x keys, read M-major out of dS^T) K (keys x D, N-major),
        // a panel of W columns at a time
#pragma unroll
        for (int p = 0; p < P; ++p) {
            float dq[W / 8][4];
            wgmma::fence();
#pragma unroll
            for (int kk = 0; kk < 64 / 16; ++kk)
                wgmma::mma_ss<1, 1>(dq, desc_ds + 128 * kk, desc_k[p] + 128 * kk, kk > 0);
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::hold(dq);
            wgmma::hold(dv_acc);
            wgmma::hold(dk_acc);
            if (p == 0) {
                wgmma::hold(pa);
                wgmma::hold(dsa);
                if (leader) tma::arrive(empty(s));  // every product that reads this stage's Q and dO is done
            }
            add_dq(dq_bh, D, dq, i0 + warp * 16, p * W, Tq, g, t);
        }
        wg_sync();  // dS^T is rewritten next
    }
    store_key_grads<D>(dk + b * lk.sb + h * lk.sh, lk.st, dv + b * lv.sb + h * lv.sh, lv.st, dk_acc, dv_acc, key, S, t,
                       scale);
#else
    __trap();  // built without sm_90a: attention_backward_ws never launches this
#endif
}

template <int D, int NWG>
bool backward(cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout, const void* q, const void* k,
              const void* v, const float* lse, const float* delta, AttnLayout lq, AttnLayout lk, AttnLayout lv,
              AttnLayout lo, int B, int H, int T, int S, bool causal, float scale) {
    constexpr int BKB = 64 * NWG;
    CUtensorMap mq, mk, mv, mdo;
    bool rq, rk, rv, rdo;
    if (!make_map(&mq, &rq, q, lq, B, H, T, D, BRB) || !make_map(&mk, &rk, k, lk, B, H, S, D, BKB) ||
        !make_map(&mv, &rv, v, lv, B, H, S, D, BKB) || !make_map(&mdo, &rdo, dout, lo, B, H, T, D, BRB))
        return false;
    // K, V (BKB, D); Q, dO [kStages]; dS^T a consumer; lse, delta [kStages]; the mbarriers; slack to
    // align the tiles to 1024 bytes
    const int bytes = (int)Panels<D>::tile_bytes(2 * BKB + 2 * kStages * BRB) + NWG * 64 * 128 + 2 * kStages * BRB * 4 +
                      8 * (1 + 2 * kStages) + 1024;
    check(cudaFuncSetAttribute(bwd_ws_kernel<D, NWG>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "attention_backward");
    const unsigned grid = (unsigned)(ceil_div(S, BKB) * B * H);
    bwd_ws_kernel<D, NWG><<<grid, (NWG + 1) * 128, bytes, st>>>(
        mq, mk, mv, mdo, (int)rq | (int)rk << 1 | (int)rv << 2 | (int)rdo << 3, (bf16*)dk, (bf16*)dv, dq_acc, lse,
        delta, lk, lv, H, T, S, causal, scale, scale * kLog2e);
    return true;
}

}  // namespace

bool attention_backward_ws(int kernel, cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout,
                           const void* q, const void* k, const void* v, const float* lse, const float* delta,
                           AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S,
                           int D, bool causal, float scale) {
    const int nwg = kernel == 1 ? 3 : kernel == 2 ? 2 : 0;
    if (D == 64 && nwg == 3)
        return backward<64, 3>(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal, scale);
    if (D == 64 && nwg == 2)
        return backward<64, 2>(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal, scale);
    if (D == 128 && nwg != 0)  // three consumers would spill at 128 columns of dK and dV
        return backward<128, 2>(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal,
                                scale);
    return false;
}

}  // namespace engine
