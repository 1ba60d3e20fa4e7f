// bf16 attention forward on Hopper, warp-specialised as FlashAttention-3 is, head dims 32, 64 and 128:
// attention_wgmma.cu's forward hands its work here wherever TMA can describe q, k and v. (At head dim
// 32 the TMA box is still 64 columns wide: the 32 past the row are the tensor's out-of-bounds, filled
// with zeros, so a tile has wgmma.cuh's layout of 128-byte rows and the products read its first half.)
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
// earlier): it stores its output, then waits for the remaining ones and releases them unread.
#include <cuda_bf16.h>

#include <algorithm>
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

__device__ unsigned g_next_item;  // the dynamic walk's counter (attn::next_index)

// a work item: its (batch, head), first query (tile 0's is -q_pad: forward() says why) and the key
// tiles the block loads for it
struct Item {
    int bh, b, h, q0, ntiles;
};

// (NWG + 1) * 128 threads, one block an SM. The work items are the query tiles in attn::tile_order
// (heaviest first). The grid is one block an item, or a persistent one of at most a block an SM. In
// a persistent grid, block i takes item i, then the next unclaimed one from next_item (a dynamic
// walk, next_index), and the producer loads the next item's Q (two buffers) and first K and V while
// the consumers finish the current one. The producer writes each Q buffer's item, decoded, beside it
// (item_of) before the buffer's "full" arrival; an item of (batch, head) -1 closes the walk. The
// K/V ring runs on across items: entry e of the block's walk sits in stage e % kStages.
//
// With Turns (FlashAttention-3's scheduler barrier) the consumers take turns to issue their products:
// a token goes round them on named barriers 1 .. NWG (consumer c's barrier: its own 128 threads wait,
// the previous consumer's 128 arrive), so that one warpgroup's softmax runs while the next one's
// products are on the tensor cores, instead of all three competing for them at once. Each consumer
// takes the token once a K/V entry of every item (for S_0, then for each step that issues S_{j+1},
// and once for each entry it skips), so the turns stay in step across warpgroups and items; it is
// never held across a wait.
//
// A consumer whose queries see only the first half of their last key tile (under a causal mask, half
// of the consumers' last tiles) computes S over that half alone (m64n64, into an accumulator of its
// own, sh: written into the first columns of s, it made ptxas serialise the wgmma of most of the
// kernels, for lack of registers), takes its softmax and multiplies P V over its keys only.
//
// Each consumer stages its output in a tile of its own (stage_output) and one of its threads hands it
// to a TMA store (map to), as FlashAttention-3's epilogue does, instead of each thread storing its pairs
// of columns to global memory.
template <int D, int NWG, int BN, bool Turns>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
    fwd_ws_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap to, int rows_inner,
                  float* __restrict__ lse, int B, int H, int Tq, int S, int q_pad, bool causal, float scale2,
                  int group, unsigned* next_item) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 64 * NWG;
    using PD = Panels<D>;
    constexpr int P = PD::P, W = PD::W;
    constexpr uint32_t kQ = PD::tile_bytes(BM), kKV = PD::tile_bytes(BN);
    extern __shared__ unsigned char smem_raw[];
    // Q [2](BM, D); K, V [kStages](BN, D); O [NWG](64, D): swizzled
    const uint32_t sQ = (smem_addr(smem_raw) + 1023) & ~1023u;
    const uint32_t sK = sQ + 2 * kQ, sV = sK + kStages * kKV, sO = sV + kStages * kKV;
    // mbarriers: per Q buffer full, empty; per stage K full, V full, K empty, V empty
    const uint32_t bars = sO + NWG * PD::tile_bytes(64);
    auto q_full = [&](int buf) { return bars + 16 * buf; };
    auto q_empty = [&](int buf) { return bars + 8 + 16 * buf; };
    auto k_full = [&](int s) { return bars + 32 + 32 * s; };
    auto v_full = [&](int s) { return bars + 40 + 32 * s; };
    auto k_empty = [&](int s) { return bars + 48 + 32 * s; };
    auto v_empty = [&](int s) { return bars + 56 + 32 * s; };
    const int qtiles = (Tq + BM - 1) / BM, work = qtiles * B * H, off = S - Tq;
    // the item of each Q buffer, written by the producer before the buffer's "full" arrival, so that the
    // consumers do not decode it again (five divisions)
    volatile Item* item_of = reinterpret_cast<Item*>(smem_raw + (bars + 32 + 32 * kStages - smem_addr(smem_raw)));
    auto item = [&](int index) {
        const TileOrder at = tile_order(qtiles, group, B * H, /*heavy_last=*/true, index);
        const int q0 = at.tile * BM - q_pad;
        const int kv_end = causal ? max(0, min(S, min(q0 + BM, Tq) + off)) : S;
        return Item{at.bh, at.bh / H, at.bh % H, q0, (kv_end + BN - 1) / BN};
    };
    // the warpgroup's index through a shuffle, uniform to the compiler (else it serialises the wgmma)
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; ++i) {
            tma::init(q_full(i), 1);
            tma::init(q_empty(i), NWG * kArrivalsPerConsumer);
        }
        for (int s = 0; s < kStages; ++s) {
            tma::init(k_full(s), 1);
            tma::init(v_full(s), 1);
            tma::init(k_empty(s), NWG * kArrivalsPerConsumer);
            tma::init(v_empty(s), NWG * kArrivalsPerConsumer);
        }
        tma::fence_init();
    }
    __syncthreads();

    // Every consumer releases every Q buffer and K/V entry of every item, also those it does not read
    // (queries past Tq, or keys past its causal end), each of its warps only after waiting for it to
    // be full (attn::release), so that no arrival can fall into an earlier phase of the barrier.
    if (wg == 0) {  // the producer
        tma::release_registers<RegisterSplit<NWG>::producer>();
        if (threadIdx.x == 0) {
            int e = 0;  // K/V entries loaded so far
            for (int index = blockIdx.x, n = 0;; ++n) {
                const int buf = n & 1;
                tma::wait(q_empty(buf), ((n >> 1) & 1) ^ 1);  // the buffer's previous item released
                if (index >= work) {  // the end of the walk, for the consumers
                    item_of[buf].bh = -1;
                    tma::arrive(q_full(buf));
                    break;
                }
                const Item it = item(index);
                item_of[buf].bh = it.bh;
                item_of[buf].b = it.b;
                item_of[buf].h = it.h;
                item_of[buf].q0 = it.q0;
                item_of[buf].ntiles = it.ntiles;
                tma::arrive_expect_tx(q_full(buf), kQ);
                load_rows<P, BM>(sQ + buf * kQ, &tq, rows_inner & 1, q_full(buf), it.q0, it.h, it.b);
                index = next_index(index, work, next_item);
                for (int j = 0; j < it.ntiles; ++j, ++e) {
                    const int s = e % kStages;
                    const uint32_t parity = ((e / kStages) & 1) ^ 1;  // the stage's previous entry released
                    tma::wait(k_empty(s), parity);
                    tma::arrive_expect_tx(k_full(s), kKV);
                    load_rows<P, BN>(sK + s * kKV, &tk, rows_inner & 2, k_full(s), j * BN, it.h, it.b);
                    tma::wait(v_empty(s), parity);
                    tma::arrive_expect_tx(v_full(s), kKV);
                    load_rows<P, BN>(sV + s * kKV, &tv, rows_inner & 4, v_full(s), j * BN, it.h, it.b);
                }
            }
        }
        return;
    }

    tma::claim_registers<RegisterSplit<NWG>::consumer>();
    const int c = wg - 1;  // consumer c owns queries q0 + 64 c .. of each item
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    auto wait_turn = [&] {
        if constexpr (Turns) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + c) : "memory");
    };
    auto pass_turn = [&] {
        if constexpr (Turns) asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (c + 1) % NWG) : "memory");
    };
    if constexpr (Turns) {  // the first consumer holds the token first
        if (c == 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    }
    auto stage = [](int e) { return e % kStages; };
    auto phase = [](int e) { return (uint32_t)((e / kStages) & 1); };

    int e0 = 0;  // the block's first K/V entry of the current item
    for (int n = 0;; ++n) {
        const int buf = n & 1;
        tma::wait(q_full(buf), (n >> 1) & 1);
        const Item itm{item_of[buf].bh, item_of[buf].b, item_of[buf].h, item_of[buf].q0, item_of[buf].ntiles};
        if (itm.bh < 0) break;
        const int q0 = itm.q0, ntiles = itm.ntiles;
        const int wq0 = q0 + c * 64;
        const bool active = wq0 >= 0 && wq0 < Tq;  // (q_pad: whole warpgroups of the first tile lie before 0)
        const int wg_keys = !active ? 0 : causal ? max(0, min(S, min(wq0 + 64, Tq) + off)) : S;  // keys it sees
        const int wg_tiles = !active ? 0 : causal ? (wg_keys + BN - 1) / BN : ntiles;
        const bool half_last = wg_tiles > 0 && wg_keys - (wg_tiles - 1) * BN <= BN / 2;
        auto is_full = [&](int tile) {  // wholly inside the visible region for every row of the warpgroup
            return (tile + 1) * BN <= S && (!causal || (tile + 1) * BN - 1 <= wq0 + off);
        };
        uint64_t desc_q[P];  // panel p of this warpgroup's 64 rows of Q
#pragma unroll
        for (int p = 0; p < P; ++p) desc_q[p] = wgmma::desc(sQ + buf * kQ + p * (BM * 128) + c * 64 * 128);

        float acc[D / 8][4];
        float s[BN / 8][4];
        float sh[BN / 16][4];  // S of a half-seen tile: its first half
        uint32_t pa[BN / 16][4];
        zero(acc);
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];  // rows g, g + 8
        const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};
        // with `half` (a compile-time flag), of S_it's first half only: the softmax of S_it, in place; P_it's
        // A-fragments; O += P_it V_e
        auto softmax = [&](int it, auto half) {
            if constexpr (half)  // (a half tile is never full: the mask's edge is in it)
                softmax_step(sh, m, l, alpha, false, it * BN, S, causal, row, off, t, scale2);
            else softmax_step(s, m, l, alpha, is_full(it), it * BN, S, causal, row, off, t, scale2);
        };
        auto half_pa = [&]() -> uint32_t (&)[BN / 32][4] { return *reinterpret_cast<uint32_t(*)[BN / 32][4]>(&pa[0]); };
        auto to_frags = [&](auto half) {
            if constexpr (half) to_a_frags(half_pa(), sh);
            else to_a_frags(pa, s);
        };
        auto issue_s = [&](int e, auto half) {  // S = Q_wg K_e^T (with `half`, over the tile's first half)
            if constexpr (half) issue_scores<P, W, BN / 2, BN>(sh, desc_q, sK + stage(e) * kKV);
            else issue_scores<P, W, BN>(s, desc_q, sK + stage(e) * kKV);
        };
        auto hold_s = [&](auto half) {
            if constexpr (half) wgmma::hold(sh);
            else wgmma::hold(s);
        };
        auto issue_o = [&](int e, auto half) {
            if constexpr (half) issue_pv<P, W, BN / 2, D, BN>(acc, half_pa(), sV + stage(e) * kKV);
            else issue_pv<P, W, BN, D>(acc, pa, sV + stage(e) * kKV);
        };

        if (wg_tiles == 0) release(q_empty(buf));
        using yes = std::true_type;
        using no = std::false_type;
        auto first = [&](auto half) {  // S_0 and its softmax
            tma::wait(k_full(stage(e0)), phase(e0));
            wait_turn();
            wgmma::fence();
            issue_s(e0, half);
            pass_turn();
            wgmma::wait<0>();
            hold_s(half);
            if (wg_tiles == 1) release(q_empty(buf));  // its last product with Q
            release(k_empty(stage(e0)));
            softmax(0, half);
            to_frags(half);
        };
        if (wg_tiles == 0) {  // (nothing: its release is above)
        } else if (wg_tiles == 1 && half_last) first(yes{});
        else first(no{});
        // O += P_it V_it; with `next` (a compile-time flag: no wgmma sits in a branch), also S_{it+1} and
        // its softmax, run while P V is on the tensor cores. With `half` P_it V_it is over the first half
        // of the tile's keys; with `next_half` S_{it+1}'s softmax and fragments are of its first half.
        auto step = [&](int it, auto next, auto next_half, auto half) {
            const int e = e0 + it;
            if constexpr (next) tma::wait(k_full(stage(e + 1)), phase(e + 1));
            tma::wait(v_full(stage(e)), phase(e));
            rescale_rows(acc, alpha);  // the previous tiles' output, to this tile's max
            wgmma::hold(acc);          // the rescale stays before the fence
            if constexpr (next) wait_turn();
            wgmma::fence();
            if constexpr (next) issue_s(e + 1, next_half);
            issue_o(e, half);
            if constexpr (next) {
                pass_turn();
                wgmma::wait<1>();
                hold_s(next_half);
                if (it + 2 == wg_tiles) release(q_empty(buf));
                release(k_empty(stage(e + 1)));
                softmax(it + 1, next_half);
            }
            wgmma::wait<0>();
            wgmma::hold(acc);
            wgmma::hold(pa);
            release(v_empty(stage(e)));
            if constexpr (next) to_frags(next_half);
        };
        for (int it = 0; it < wg_tiles; ++it) {  // branches uniform over the warpgroup
            if (it + 2 < wg_tiles) step(it, yes{}, no{}, no{});
            else if (it + 2 == wg_tiles) {
                if (half_last) step(it, yes{}, yes{}, no{});
                else step(it, yes{}, no{}, no{});
            } else if (half_last) step(it, no{}, no{}, yes{});
            else step(it, no{}, no{}, no{});
        }
        if (active) {
            // the tile's previous store has read it (its thread waits, the barrier tells the others), the
            // output's stores land, are fenced for the async proxy, and one thread hands the tile over
            const uint32_t tile = sO + c * PD::tile_bytes(64);
            const bool issuer = (threadIdx.x & 127) == 0;
            if (issuer) tma::wait_read<0>();
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + NWG + c) : "memory");
            stage_output<D>(smem_raw + (tile - smem_addr(smem_raw)), lse + (int64_t)itm.bh * Tq, acc, l, m, row, Tq,
                            warp, g, t);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + NWG + c) : "memory");
            if (issuer) store_rows<P, 64>(&to, rows_inner & 8, tile, wq0, itm.h, itm.b);
        }
        for (int e = e0 + wg_tiles; e < e0 + ntiles; ++e) {  // the entries past this warpgroup's causal end
            wait_turn();
            pass_turn();
            tma::wait(k_full(stage(e)), phase(e));
            release(k_empty(stage(e)));
            tma::wait(v_full(stage(e)), phase(e));
            release(v_empty(stage(e)));
        }
        e0 += ntiles;
    }
    if ((threadIdx.x & 127) == 0) tma::wait_read<0>();  // the last store has read its tile
#else
    __trap();  // built without sm_90a: attention_forward_ws never launches this
#endif
}

// dynamic: a persistent grid walking the items dynamically, else a block an item
unsigned* counters[64] = {};  // g_next_item's address on each device

template <int D, int NWG, int BN, bool Turns>
bool forward(bool dynamic, int device, cudaStream_t st, void* o, float* lse, const void* q, const void* k,
             const void* v, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S,
             bool causal, float scale) {
    constexpr int BM = 64 * NWG;
    CUtensorMap mq, mk, mv, mo;
    bool rq, rk, rv, ro;
    if (!make_map(&mq, &rq, q, lq, B, H, T, D, BM) || !make_map(&mk, &rk, k, lk, B, H, S, D, BN) ||
        !make_map(&mv, &rv, v, lv, B, H, S, D, BN) || !make_map(&mo, &ro, o, lo, B, H, T, D, 64))
        return false;
    // Q [2], K and V [kStages], O [NWG]; the mbarriers and the Q buffers' items; slack to align the tiles
    const int bytes = (int)Panels<D>::tile_bytes(3 * BM + 2 * kStages * BN) + 8 * (4 + 4 * kStages) + 2 * (int)sizeof(Item) + 1024;
    auto kernel = fwd_ws_kernel<D, NWG, BN, Turns>;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "attention");
    // a block an item, or (dynamic) at most a block an SM walking the items
    const int64_t items = (int64_t)ceil_div(T, BM) * B * H;
    // From T 512 the query tiles end at T rather than start at 0, to within 64 rows: where T is not a
    // multiple of BM, the tile left partly empty is then the first, the lightest under a causal mask,
    // and not the heaviest (at T 1024 and BM 192: rows -128 .. 63, one key tile for one warpgroup,
    // instead of rows 960 .. 1151, eight key tiles for one warpgroup while the other two idle). Measured
    // on an H200 at head dim 64: T 1024 ws 3 x 128 0.0911-0.0915 against 0.0930-0.0937 ms, ws 3 x 64
    // 0.101 against 0.117; at T 256 (two query tiles a head) ws 3 x 64 0.0290 against 0.0280-0.0286.
    const int q_pad = T >= 512 ? (int)(ceil_div(T, BM) * BM - T) / 64 * 64 : 0;
    const unsigned grid = (unsigned)(dynamic ? std::min<int64_t>(items, sm_count(device)) : items);
    // The walk in groups of heads of at most 32 MB of K and V (16 at head dim 128). On an H100, ms at
    // B 16 T 1024 (H 12 D 64; H 6 D 128) for groups of 8, 16 and 32 MB and a batch element's heads:
    // D 64 0.085, 0.083, 0.080 against 0.091; D 128 0.072, 0.069, 0.071 against 0.077
    constexpr int kWalkGroupMb = D > 64 ? 16 : 32;
    kernel<<<grid, (NWG + 1) * 128, bytes, st>>>(mq, mk, mv, mo, (int)rq | (int)rk << 1 | (int)rv << 2 | (int)ro << 3,
                                                 lse, B, H, T, S, q_pad, causal, scale * kLog2e,
                                                 walk_group(B * H, 4LL * S * D, kWalkGroupMb),
                                                 dynamic ? walk_counter(g_next_item, counters) : nullptr);
    return true;
}

}  // namespace

// kernel: consumers x keys a tile 1 2x128, 2 3x128, 3 2x64, 4 3x64 (a block an item); + 8 persistent
// with a dynamic walk; + 12 the dynamic walk with the consumers taking turns. (5-8, a persistent grid
// on a static stride, are gone: the dynamic walk beat it at every shape measured.)
bool attention_forward_ws(int kernel, int device, cudaStream_t st, void* o, float* lse, const void* q, const void* k,
                          const void* v, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H,
                          int T, int S, int D, bool causal, float scale) {
    if (kernel < 1 || kernel > 16 || (kernel > 4 && kernel < 9)) return false;
    const bool dynamic = kernel > 8, turns = kernel > 12;
    const int variant = (kernel - 1) % 4 + 1;
#define ARGS dynamic, device, st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale
#define PICK(D, NWG, BN) (turns ? forward<D, NWG, BN, true>(ARGS) : forward<D, NWG, BN, false>(ARGS))
    if (D == 32) {
        switch (variant) {
            case 1: return PICK(32, 2, 128);
            case 2: return PICK(32, 3, 128);
            case 3: return PICK(32, 2, 64);
            case 4: return PICK(32, 3, 64);
            default: return false;
        }
    }
    if (D == 64) {
        switch (variant) {
            case 1: return PICK(64, 2, 128);
            case 2: return PICK(64, 3, 128);
            case 3: return PICK(64, 2, 64);
            case 4: return PICK(64, 3, 64);
            default: return false;
        }
    }
    if (D == 128) {  // three consumers would spill at 128 columns of output
        switch (variant) {
            case 1: case 2: return PICK(128, 2, 128);
            case 3: case 4: return PICK(128, 2, 64);
            default: return false;
        }
    }
#undef PICK
#undef ARGS
    return false;
}

}  // namespace engine
