// bf16 attention backward on Hopper, warp-specialised, head dims 64 and 128: attention_wgmma.cu's
// backward hands its work here wherever TMA can describe q, k, v and dout.
//
// A block is one producer warpgroup and NWG consumer warpgroups of 64 keys each (the block owns
// BKB = 64 NWG keys):
// - the producer's first thread loads the block's K and V once, then walks the query tiles of BRB
//   (64, or 128 at head dim 64 with dQ split by rows) that see its keys, loading each tile's Q and
//   dO by TMA into a ring of two stages (a "full" and an "empty" mbarrier each), so that the
//   consumers share every Q and dO tile instead of each loading its own;
//   and its second warp stages the tile's lse (log2 domain) and delta beside them, each lane arriving
//   on the same "full" barrier;
// - each consumer runs attention_wgmma.cu's iteration on its 64 keys (S^T, dP^T; P^T, dS^T in
//   registers; dV, dK, and dQ = dS K added into dq_acc by atomics or, at head dim 64, by the L2's
//   bulk reductions of whole rows staged in shared memory), synchronising only within its
//   warpgroup (a named barrier), so the warpgroups drift apart and one's elementwise step overlaps
//   another's products;
// - or (dQ summed) each consumer stages its partial of dQ, a 64 x 64 panel at a time, in a buffer of
//   its own, and the producer's warps 2 and 3 add the consumers' partials of each query tile in
//   shared memory and hand the sum to the L2 as one bulk reduction of the tile (16 KB, 32 at head
//   dim 128): one reduction a query tile instead of one a consumer (Nsight Compute put a third of
//   the backward's time in dQ's path);
// - or (dQ split) the two consumers meet once their dS^T of the tile are stored, and each computes its
//   own 64 x 64 of the tile's dQ over both consumers' 128 keys, so that no partial of dQ crosses
//   consumers (FlashAttention-3's split of dQ between its warpgroups): at head dim 128 each its 64
//   columns of the tile's 64 queries; at head dim 64, with query tiles of 128 (S^T and dP^T of 64
//   keys x 128 queries a consumer, as FlashAttention-3's hdim-64 kernel), each its 64 queries; with
//   query tiles of 128 its dQ may go by TMA tensor reductions of tiles staged in its rows of the dS^T
//   buffer that its next tile writes (kDqSplitTma: no shared memory of its own), at head dim 128 by
//   the same reductions of tiles staged in 16 KB of its own.
//
// Under a causal mask a later consumer's keys see fewer query tiles (its first tiles are masked out
// entirely): it waits for those tiles and releases them without computing.
#include <cuda_bf16.h>

#include <algorithm>

#include "attention/attention_tiles.cuh"
#include "attention/attention_wgmma.h"
#include "attention/backward_wgmma.cuh"
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

// How dQ's partial sums reach dq_acc: an atomic a pair of elements; each consumer's bulk reductions
// of its rows (attn::reduce_dq; head dim 64); the consumers' partials summed in shared memory first,
// one bulk reduction a query tile (head dims 64 and 128); or split (two consumers: head dim 128 by
// columns, head dim 64 with query tiles of 128 by query rows): no partials across consumers, each
// computing its own 64 x 64 of the tile's dQ over both consumers' keys (the other's dS read from
// shared memory) and adding those into dq_acc by bulk reductions of its rows (kDqSplit) or by atomics
// (kDqSplitAtomic: no staging, so that K and V keep two buffers), or by TMA tensor reductions of tiles
// staged in the dS^T buffer that the consumer's next tile writes (kDqSplitTma; with query tiles of
// 128 no staging memory of its own either, at head dim 128 16 KB a consumer: own_dq_staging)
enum DqPath { kDqAtomic, kDqBulk, kDqSummed, kDqSplit, kDqSplitAtomic, kDqSplitTma };
constexpr bool split_dq(int Dq) { return Dq == kDqSplit || Dq == kDqSplitAtomic || Dq == kDqSplitTma; }
constexpr bool staged_dq(int Dq) { return Dq == kDqBulk || Dq == kDqSummed || Dq == kDqSplit; }
// the summed tile (64 queries), rows of D floats back to back
constexpr uint32_t dq_sum_bytes(int D) { return 64 * D * 4; }
// (dQ by TMA) where a consumer stages its 64 x 64 of dQ for the tensor reductions: with query tiles of
// 128 (head dim 64) in the other dS^T buffer, which holds it; at head dim 128 (query tiles of 64, a
// dS^T tile half its size) in 16 KB of its own, in the same swizzled boxes
constexpr bool own_dq_staging(int Dq, int BRB) { return Dq == kDqSplitTma && BRB == 64; }
// a consumer's staging of dQ: rows kDqStride apart (bulk paths), or the boxes of own_dq_staging
constexpr uint32_t dq_staging_bytes(int Dq, int BRB) {
    return staged_dq(Dq) ? 64 * kDqStride : own_dq_staging(Dq, BRB) ? 64 * 64 * 4 : 0;
}
// K and V's buffers: two (the next item's load while this one runs), or one where dQ's staging at
// head dim 128 (summed, or split with bulk or tensor reductions) or beside query tiles of 128 (split with bulk
// reductions) needs the room; a launch with one is a block an item (the walk never reuses the buffer)
constexpr int kv_buffers(int D, int Dq, int BRB) {
    return (D == 128 && (Dq == kDqSummed || Dq == kDqSplit || Dq == kDqSplitTma)) || (BRB == 128 && Dq == kDqSplit)
               ? 1
               : 2;
}
// dS^T's buffers a consumer: two where dQ is split (the other consumer may still read one tile's
// while this one writes the next's), else one
constexpr int ds_buffers(int Dq) { return split_dq(Dq) ? 2 : 1; }

__device__ unsigned g_next_item;  // the dynamic walk's counter (attn::next_index)

// a work item: its (batch, head), first key, first query tile and query tiles
struct Item {
    int bh, b, h, k0, i_begin, ntiles;
};
// a copy of the item the producer wrote beside a K/V buffer (ordered by the buffer's "full" barrier)
__device__ __forceinline__ Item read_item(const volatile Item& it) {
    return Item{it.bh, it.b, it.h, it.k0, it.i_begin, it.ntiles};
}

// (NWG + 1) * 128 threads, one block an SM. Block i takes key tile (work item) i of attn::tile_order
// (heaviest first), then, in a persistent grid of at most a block an SM, the next unclaimed one (a
// dynamic walk, attn::next_index); K and V sit in kv_buffers(D, Dq, BRB) buffers (two: the next item's
// load while this one runs). The Q / dO ring runs on across items: entry e of the block's walk sits
// in stage e % kStages. The producer writes each K/V buffer's item, decoded, beside it (item_of)
// before the buffer's "full" arrival, so that no other thread repeats tile_order's divisions; an
// item of (batch, head) -1 closes the walk.
// Dq: the DqPath of dQ's partial sums; BRB: the query tile's rows (64, or 128 where dQ is split by rows);
// Overlap: FlashAttention-3's order of a tile's steps (P^T computed while dP^T's product runs; dK's
// product issued after dQ's, and dQ handed to dq_acc while dK's runs), else each step after the last.
template <int D, int NWG, int Dq, int BRB, bool Overlap>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
    bwd_ws_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                  const __grid_constant__ CUtensorMap tdq, int rows_inner, bf16* __restrict__ dk,
                  bf16* __restrict__ dv, float* __restrict__ dq_acc,
                  const float* __restrict__ lse, const float* __restrict__ delta, AttnLayout lk, AttnLayout lv, int B,
                  int H, int Tq, int S, bool causal, float scale, float scale2, int group, unsigned* next_item) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BKB = 64 * NWG;
    using PD = Panels<D>;
    constexpr int P = PD::P, W = PD::W;
    static_assert(Dq != kDqBulk || D == 64, "dQ by rows of 64 floats");
    static_assert(Dq != kDqSummed || D >= 64, "dQ summed a panel of 64 columns at a time");
    static_assert(BRB == 64 || (BRB == 128 && D == 64 && split_dq(Dq)), "query tiles of 128 split dQ by rows");
    static_assert(!split_dq(Dq) || (NWG == 2 && (D == 128) == (BRB == 64)),
                  "dQ split into a panel of columns (head dim 128) or of query rows (head dim 64) a consumer");
    constexpr int NQ = BRB / 64;  // the query tile's 64-query halves (dS^T's tiles a consumer)
    constexpr uint32_t kDqRows = dq_staging_bytes(Dq, BRB);  // a consumer's staged dQ panel
    constexpr uint32_t kSum = Dq == kDqSummed ? dq_sum_bytes(D) : 0;
    constexpr int kKv = kv_buffers(D, Dq, BRB), kDs = ds_buffers(Dq);
    constexpr int kSummers = Dq == kDqSummed ? 2 : 0;  // the producer's warps 2 and 3 sum dQ
    constexpr uint32_t kKeys = PD::tile_bytes(BKB), kTile = PD::tile_bytes(BRB), kPanel = 64 * 128;
    extern __shared__ unsigned char smem_raw[];
    // K, V [kKv](BKB, D); Q, dO [kStages](BRB, D); dS^T (64, BRB) as NQ tiles (64, 64) [kDs] a
    // consumer; (bulk paths) dQ's rows a consumer; (summed) their sum; lse, delta [kStages][BRB]; the
    // mbarriers
    const uint32_t sK = (smem_addr(smem_raw) + 1023) & ~1023u, sV = sK + kKv * kKeys;
    const uint32_t sQ = sV + kKv * kKeys, sdO = sQ + kStages * kTile, sdS0 = sdO + kStages * kTile;
    const uint32_t sDq0 = sdS0 + kDs * NWG * NQ * kPanel, sDqSum = sDq0 + NWG * kDqRows;
    float* sLse = reinterpret_cast<float*>(smem_raw + (sDqSum + kSum - smem_addr(smem_raw)));
    float* sDelta = sLse + kStages * BRB;
    const uint32_t bars = smem_addr(sDelta + kStages * BRB);
    auto kv_full = [&](int buf) { return bars + 16 * buf; };
    auto kv_empty = [&](int buf) { return bars + 8 + 16 * buf; };
    auto full = [&](int s) { return bars + 32 + 16 * s; };
    auto empty = [&](int s) { return bars + 40 + 16 * s; };
    // (summed) consumer c's staged partial: written (4 warps arrive), and read by the summing warps (2)
    auto dq_full = [&](int c) { return bars + 32 + 16 * kStages + 16 * c; };
    auto dq_empty = [&](int c) { return bars + 40 + 16 * kStages + 16 * c; };
    // the item of each K/V buffer, written by the producer before the buffer's "full" arrival
    volatile Item* item_of = reinterpret_cast<Item*>(
        smem_raw + (bars + 32 + 16 * kStages + (Dq == kDqSummed ? 16 * NWG : 0) - smem_addr(smem_raw)));
    auto stage = [](int e) { return e % kStages; };
    auto phase = [](int e) { return (uint32_t)((e / kStages) & 1); };
    const int ktiles = (S + BKB - 1) / BKB, work = ktiles * B * H, off = S - Tq;
    auto item = [&](int index) {
        const TileOrder at = tile_order(ktiles, group, B * H, /*heavy_last=*/false, index);
        const int k0 = at.tile * BKB;
        const int i_begin = causal ? max(0, k0 - off) / BRB * BRB : 0;  // the first query tile any consumer sees
        return Item{at.bh, at.bh / H, at.bh % H, k0, i_begin, Tq > i_begin ? (Tq - i_begin + BRB - 1) / BRB : 0};
    };
    // the query tiles of an item that consumer c skips: all where its keys are past S, else those
    // wholly before its first visible query
    auto skipped = [&](const Item& it, int c) {
        const int kc0 = it.k0 + 64 * c;
        return kc0 >= S ? it.ntiles : causal ? (max(0, kc0 - off) / BRB * BRB - it.i_begin) / BRB : 0;
    };
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; ++i) {
            tma::init(kv_full(i), 1);
            tma::init(kv_empty(i), NWG * kArrivalsPerConsumer + kSummers);
        }
        for (int s = 0; s < kStages; ++s) {
            tma::init(full(s), 1 + 32);  // the TMA thread's arrival, and the lse / delta warp's lanes
            tma::init(empty(s), NWG * kArrivalsPerConsumer);
        }
        if constexpr (Dq == kDqSummed)
            for (int c = 0; c < NWG; ++c) {
                tma::init(dq_full(c), kArrivalsPerConsumer);
                tma::init(dq_empty(c), kSummers);
            }
        tma::fence_init();
    }
    __syncthreads();

    // Every consumer releases every K/V buffer and Q/dO entry of every item, also those it does not
    // read (keys past S, query tiles before its causal start), each of its warps only after waiting
    // for it to be full (attn::release), so that no arrival can fall into an earlier phase.
    if (wg == 0) {  // the producer
        tma::release_registers<RegisterSplit<NWG>::producer>();
        if (threadIdx.x == 0) {
            int e = 0;  // Q/dO entries loaded so far
            for (int index = blockIdx.x, n = 0;; ++n) {
                const int buf = n & 1;
                tma::wait(kv_empty(buf), ((n >> 1) & 1) ^ 1);  // the buffer's previous item released
                if (index >= work) {  // the end of the walk, for the consumers and the lse / delta warp
                    item_of[buf].bh = -1;
                    tma::arrive(kv_full(buf));
                    break;
                }
                const Item it = item(index);
                item_of[buf].bh = it.bh;
                item_of[buf].b = it.b;
                item_of[buf].h = it.h;
                item_of[buf].k0 = it.k0;
                item_of[buf].i_begin = it.i_begin;
                item_of[buf].ntiles = it.ntiles;
                tma::arrive_expect_tx(kv_full(buf), 2 * kKeys);
                load_rows<P, BKB>(sK + buf % kKv * kKeys, &tk, rows_inner & 2, kv_full(buf), it.k0, it.h, it.b);
                load_rows<P, BKB>(sV + buf % kKv * kKeys, &tv, rows_inner & 4, kv_full(buf), it.k0, it.h, it.b);
                index = next_index(index, work, next_item);
                for (int j = 0; j < it.ntiles; ++j, ++e) {
                    const int s = stage(e), i0 = it.i_begin + j * BRB;
                    tma::wait(empty(s), phase(e) ^ 1);  // the stage's previous entry released
                    tma::arrive_expect_tx(full(s), 2 * kTile);
                    load_rows<P, BRB>(sQ + s * kTile, &tq, rows_inner & 1, full(s), i0, it.h, it.b);
                    load_rows<P, BRB>(sdO + s * kTile, &tdo, rows_inner & 8, full(s), i0, it.h, it.b);
                }
            }
        } else if (threadIdx.x >> 5 == 1) {  // lse (log2 domain) and delta of each entry
            const int lane = threadIdx.x & 31;
            int e = 0;
            for (int n = 0;; ++n) {
                tma::wait(kv_full(n & 1), (n >> 1) & 1);  // the item is beside its K and V
                const Item it = read_item(item_of[n & 1]);
                if (it.bh < 0) break;
                for (int j = 0; j < it.ntiles; ++j, ++e) {
                    const int s = stage(e), i0 = it.i_begin + j * BRB;
                    tma::wait(empty(s), phase(e) ^ 1);
                    for (int i = lane; i < BRB; i += 32) {  // +inf past Tq or where the query saw no key: P = 0
                        const bool ok = i0 + i < Tq;
                        const float v = ok ? lse[(int64_t)it.bh * Tq + i0 + i] : INFINITY;
                        sLse[s * BRB + i] = v == -INFINITY ? INFINITY : v * kLog2e;
                        sDelta[s * BRB + i] = ok ? delta[(int64_t)it.bh * Tq + i0 + i] : 0.f;
                    }
                    tma::arrive(full(s));
                }
            }
        } else if (Dq == kDqSummed && threadIdx.x >> 6 == 1) {
            // warps 2 and 3: the consumers' partials of each entry summed into sDqSum, which thread 64
            // hands to the L2 as one bulk reduction (consumer 0 has a partial of every entry: its keys
            // are the item's first)
            const int r = threadIdx.x - 64;  // 0 .. 63: float4 r, r + 64, ... of the tile
            const uint32_t sum_bar = NWG + 1;   // the named barrier of these 64 threads (consumers: 1 .. NWG)
            auto sync = [&] { asm volatile("bar.sync %0, 64;\n" ::"r"(sum_bar) : "memory"); };
            int taken[NWG] = {};  // partials taken from each consumer so far
            for (int n = 0;; ++n) {
                tma::wait(kv_full(n & 1), (n >> 1) & 1);
                const Item it = read_item(item_of[n & 1]);
                release(kv_empty(n & 1));  // only its item was needed: the buffer may be refilled
                if (it.bh < 0) break;
                int skip[NWG];
#pragma unroll
                for (int c = 0; c < NWG; ++c) skip[c] = skipped(it, c);
                for (int j = 0; j < it.ntiles; ++j) {
#pragma unroll
                    for (int p = 0; p < P; ++p) {  // the consumers stage a panel of 64 columns at a time
#pragma unroll
                        for (int c = 0; c < NWG; ++c)
                            if (j >= skip[c]) tma::wait(dq_full(c), taken[c] & 1);
                        if (p == 0) {
                            if (r == 0) tma::wait_read<0>();  // the previous tile's reduction has read sDqSum
                            sync();
                        }
#pragma unroll 1
                        for (int f = r; f < BRB * 16; f += 64) {  // float4 f: row f / 16, columns 4 (f % 16) ..
                            const uint32_t at = (f >> 4) * kDqStride + (f & 15) * 16;
                            float4 sum = ld_shared_f4(sDq0 + at);
#pragma unroll
                            for (int c = 1; c < NWG; ++c)
                                if (j >= skip[c]) {
                                    const float4 v = ld_shared_f4(sDq0 + c * kDqRows + at);
                                    sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
                                }
                            st_shared_f4(sDqSum + (f >> 4) * (D * 4) + p * 256 + (f & 15) * 16, sum);
                        }
#pragma unroll
                        for (int c = 0; c < NWG; ++c)
                            if (j >= skip[c]) release(dq_empty(c)), ++taken[c];
                    }
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the sum, before the bulk read
                    sync();
                    const int i0 = it.i_begin + j * BRB;
                    if (r == 0) {
                        tma::reduce_add_f32(dq_acc + ((int64_t)it.bh * Tq + i0) * D, sDqSum, min(BRB, Tq - i0) * D * 4);
                        tma::commit();
                    }
                }
            }
            if (r == 0) tma::wait_done<0>();  // the last reduction, before the block's shared memory goes
        }
        return;
    }

    tma::claim_registers<RegisterSplit<NWG>::consumer>();
    const int c = wg - 1;  // consumer c owns keys k0 + 64 c .. k0 + 64 c + 63 of each item
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // this warp's dQ rows (or its two boxes)
    const uint32_t sDq = sDq0 + c * kDqRows + warp * (own_dq_staging(Dq, BRB) ? 4096 : 16 * kDqStride);
    unsigned char* const rows = smem_raw + (sDq - smem_addr(smem_raw));
    // consumer cc's dS^T in buffer b (its NQ tiles of 64 queries, kPanel apart)
    auto sdS = [&](int b, int cc) { return sdS0 + (b * NWG + cc) * NQ * kPanel; };
    auto wg_sync = [&] { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory"); };
    // (split dQ) both consumers' 256 threads: every dS^T of the tile stored, or an item done
    auto pair_sync = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(NWG + 2) : "memory"); };
    // (dQ by TMA) the reductions of this warp's last staged dQ have read it, so that its rows of dS^T,
    // where it was staged, may be stored (or, staged in its own buffer, the next may be staged)
    auto staging_read = [&] {
        if constexpr (Dq == kDqSplitTma) {
            if (lane == 0) tma::wait_read<0>();
            __syncwarp();
        }
    };
    // (dQ by TMA) the warp's staged dQ not yet handed to the L2: where (its two boxes of 32 columns,
    // `halves` apart), its first query row and column, (batch, head)
    constexpr uint32_t halves = own_dq_staging(Dq, BRB) ? 2048 : kPanel;
    bool dq_pending = false;
    uint32_t staged_at = 0;
    int staged_row = 0, staged_col = 0, staged_bh = 0;
    auto flush_dq = [&] {
        if constexpr (Dq == kDqSplitTma)
            if (dq_pending) {
                reduce_dq_tiles(&tdq, staged_row, staged_col, staged_bh, staged_at, staged_at + halves, lane);
                dq_pending = false;
            }
    };

    int e0 = 0;      // the block's first Q/dO entry of the current item
    int staged = 0;  // (summed) dQ partials this consumer has staged
    for (int n = 0;; ++n) {
        const int buf = n & 1;
        tma::wait(kv_full(buf), (n >> 1) & 1);
        const Item itm = read_item(item_of[buf]);
        if (itm.bh < 0) break;
        const int kc0 = itm.k0 + 64 * c, ntiles = itm.ntiles, skip = skipped(itm, c);
        const int skip_last = skipped(itm, NWG - 1);  // (split dQ) tiles from here on, both consumers compute
        // (split dQ) consumer 0 writes its dS^T of a tile into the buffer that the other consumer read two
        // tiles before: the pair's barrier of the tile between orders the two, where that tile is split.
        // Where it is not (the first of an item that consumer 0 starts alone), this barrier does.
        if constexpr (split_dq(Dq))
            if (skip_last > 0) pair_sync();
        float* dq_bh = dq_acc + (int64_t)itm.bh * Tq * D;
        float dk_acc[D / 8][4], dv_acc[D / 8][4];
        zero(dk_acc);
        zero(dv_acc);
        const int key[2] = {kc0 + warp * 16 + g, kc0 + warp * 16 + g + 8};
        uint64_t desc_k[P], desc_v[P];  // this consumer's 64 rows of each panel
#pragma unroll
        for (int p = 0; p < P; ++p)
            desc_k[p] = wgmma::desc(sK + buf % kKv * kKeys + p * (BKB * 128) + c * kPanel),
            desc_v[p] = wgmma::desc(sV + buf % kKv * kKeys + p * (BKB * 128) + c * kPanel);

        if (skip >= ntiles) release(kv_empty(buf));
        for (int j = 0; j < ntiles; ++j) {
            const int entry = e0 + j, s = stage(entry), i0 = itm.i_begin + j * BRB, ds_buf = entry % kDs;
            tma::wait(full(s), phase(entry));
            if (j < skip) {  // no query of this tile sees these keys
                release(empty(s));
                continue;
            }
            uint64_t desc_q[P], desc_do[P];
#pragma unroll
            for (int p = 0; p < P; ++p)
                desc_q[p] = wgmma::desc(sQ + s * kTile + p * (BRB * 128)),
                desc_do[p] = wgmma::desc(sdO + s * kTile + p * (BRB * 128));
            float st[BRB / 8][4], dpt[BRB / 8][4];  // S^T, dP^T: 64 keys x BRB queries
            uint32_t pa[BRB / 16][4], dsa[BRB / 16][4];
            const bool full_tile = kc0 + 64 <= S && (!causal || kc0 + 64 - 1 <= i0 + off);
            unsigned char* const ds_tile = smem_raw + (sdS(ds_buf, c) - smem_addr(smem_raw));
            if constexpr (Overlap) {
                // FlashAttention-3's order: P^T while dP^T's product runs, dS^T stored before dV's product
                // is issued, dK's after dQ's (below)
                // dP^T's accumulator starts at -delta
                issue_scores_t<P, W, BRB / 8, true, true>(st, dpt, desc_k, desc_q, desc_v, desc_do,
                                                          sDelta + s * BRB, t);
                flush_dq();  // the last tile's dQ, while this one's products run
                wgmma::wait<1>();
                wgmma::hold(st);
                probs_t(st, sLse + s * BRB, full_tile, i0, key, S, causal, off, scale2, t, pa);
                wgmma::wait<0>();
                wgmma::hold(dpt);
                if constexpr (!own_dq_staging(Dq, BRB)) staging_read();
                dscores_t(st, dpt, warp, g, t, ds_tile, dsa);
                issue_key_grad<P, W, D>(dv_acc, pa, desc_do);
            } else {
                issue_scores_t<P, W>(st, dpt, desc_k, desc_q, desc_v, desc_do);
                flush_dq();
                wgmma::wait<0>();
                wgmma::hold(st);
                wgmma::hold(dpt);
                if constexpr (!own_dq_staging(Dq, BRB)) staging_read();
                score_grads_t(st, dpt, sLse + s * BRB, sDelta + s * BRB, full_tile, i0, key, S, causal, off, scale2,
                              warp, g, t, ds_tile, pa, dsa);
                issue_key_grads<P, W, D>(dv_acc, dk_acc, pa, dsa, desc_do, desc_q);
            }
            wgmma::fence_smem();  // dS^T's stores, before the wgmma reads them
            // dQ (BRB queries x D) = dS (queries x keys, read M-major out of dS^T) K (keys x D, N-major),
            // 64 queries x a panel of W columns at a time. Once every product of the tile is done,
            // `settle` releases the Q/dO stage (first block) and, at the item's end, K and V (last);
            // `hand` adds the block of queries i0 + 64 h .., columns p W .. into dq_acc.
            auto settle = [&](bool first, bool last) {
                wgmma::hold(dv_acc);
                wgmma::hold(dk_acc);
                if (first) {
                    wgmma::hold(dsa);
                    release(empty(s));  // every product that reads this stage's Q and dO is done
                }
                if (last && j + 1 == ntiles) release(kv_empty(buf));  // and, at the end, with K and V
            };
            auto hand = [&](float (&dq)[W / 8][4], int p, int h, bool split) {
                if constexpr (Dq == kDqSplitTma) {
                    // (split) this warp's rows of the other dS^T buffer, the previous tile's, are free
                    // until the next tile's dS^T is stored there (staging_read, above); or (head dim 128)
                    // its 4 KB of the consumer's own staging, once the last reductions have read it.
                    // Handed to the L2 after the next tile's products are issued (flush_dq)
                    const uint32_t half0 = own_dq_staging(Dq, BRB) ? sDq : sdS(ds_buf ^ 1, c) + warp * 2048;
                    if (split) {
                        if constexpr (own_dq_staging(Dq, BRB)) staging_read();
                        stage_dq_tiles(dq, smem_raw + (half0 - smem_addr(smem_raw)),
                                       smem_raw + (half0 + halves - smem_addr(smem_raw)), lane);
                        dq_pending = true, staged_at = half0;
                        staged_row = i0 + 64 * h + warp * 16, staged_col = p * W, staged_bh = itm.bh;
                    } else  // consumer 0 alone: both halves of its dS^T are this tile's
                        add_dq(dq_bh, D, dq, i0 + 64 * h + warp * 16, p * W, Tq, g, t);
                } else if constexpr (Dq == kDqSummed) {
                    tma::wait(dq_empty(c), (staged & 1) ^ 1);  // the summing warps have read the last one
                    put_dq_rows(dq, rows, lane);
                    release(dq_full(c));
                    ++staged;
                } else if constexpr (Dq == kDqBulk || Dq == kDqSplit)
                    reduce_dq(dq_bh + p * W, D, dq, i0 + 64 * h + warp * 16, Tq, rows, sDq, lane);
                else
                    add_dq(dq_bh, D, dq, i0 + 64 * h + warp * 16, p * W, Tq, g, t);
            };
            auto finish = [&](float (&dq)[W / 8][4], bool first, bool last, int p, int h, bool split = false) {
                wgmma::wait<0>();
                wgmma::hold(dq);
                if (first) wgmma::hold(pa);  // dV's product, the last to read P^T, is done
                settle(first, last);
                hand(dq, p, h, split);
            };
            // the tile's one block of dQ, issued: with Overlap, dK's product is issued behind it and the
            // block is handed to dq_acc while dK's runs
            auto finish_one = [&](float (&dq)[W / 8][4], int p, int h, bool split) {
                if constexpr (Overlap) {
                    wgmma::wait<1>();  // dV's product done: P^T's registers are free from here
                    wgmma::hold(pa);
                    issue_key_grad<P, W, D>(dk_acc, dsa, desc_q);
                    wgmma::wait<1>();  // dQ's done
                    wgmma::hold(dq);
                    hand(dq, p, h, split);
                    wgmma::wait<0>();
                    settle(true, true);
                } else {
                    finish(dq, true, true, p, h, split);
                }
            };
            if constexpr (split_dq(Dq)) {
                // both consumers see this tile: consumer c's 64 x 64 of dQ over the 128 keys of both
                // (dS^T of each, K's rows of each): at head dim 128 K's panel c, all 64 queries; with
                // query tiles of 128 the queries 64 c .. (dS^T's tile c). Else consumer 0 alone, every
                // panel and half over its keys, below.
                if (j >= skip_last) {
                    pair_sync();
                    constexpr bool by_rows = BRB == 128;
                    const int p = by_rows ? 0 : c, h = by_rows ? c : 0;
                    const uint32_t kp = sK + buf % kKv * kKeys + p * (BKB * 128);  // K's panel p
                    float dq[W / 8][4];
                    issue_dq_panel<W, NWG>(dq, {wgmma::desc(sdS(ds_buf, 0) + h * kPanel),
                                                wgmma::desc(sdS(ds_buf, 1) + h * kPanel)},
                                           {wgmma::desc(kp), wgmma::desc(kp + kPanel)});
                    finish_one(dq, p, h, true);
                    continue;  // the next tile's dS^T goes to the other buffer: the next barrier orders it
                }
            }
            wg_sync();
            if constexpr (NQ * P == 1) {
                float dq[W / 8][4];
                issue_dq_panel<W>(dq, wgmma::desc(sdS(ds_buf, c)), desc_k[0]);
                finish_one(dq, 0, 0, false);
            } else {
                if constexpr (Overlap) issue_key_grad<P, W, D>(dk_acc, dsa, desc_q);
#pragma unroll
                for (int h = 0; h < NQ; ++h)
#pragma unroll
                    for (int p = 0; p < P; ++p) {
                        float dq[W / 8][4];
                        issue_dq_panel<W>(dq, wgmma::desc(sdS(ds_buf, c) + h * kPanel), desc_k[p]);
                        finish(dq, h == 0 && p == 0, h == NQ - 1 && p == P - 1, p, h);
                    }
            }
            if constexpr (!split_dq(Dq)) wg_sync();  // dS^T is rewritten next (split: it has two buffers)
        }
        flush_dq();  // the item's last tile's
        if (kc0 < S)
            store_key_grads<D>(dk + itm.b * lk.sb + itm.h * lk.sh, lk.st, dv + itm.b * lv.sb + itm.h * lv.sh, lv.st,
                               dk_acc, dv_acc, key, S, t, scale);
        e0 += ntiles;
    }
    // the last reductions, before the block's shared memory goes
    if constexpr (Dq == kDqBulk || Dq == kDqSplit || Dq == kDqSplitTma) tma::wait_done<0>();
#else
    __trap();  // built without sm_90a: attention_backward_ws never launches this
#endif
}

unsigned* counters[64] = {};  // g_next_item's address on each device

// dynamic: a persistent grid walking the items dynamically, else a block an item
template <int D, int NWG, int Dq, int BRB = 64, bool Overlap = false>
bool backward(bool dynamic, int device, cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout,
              const void* q, const void* k, const void* v, const float* lse, const float* delta, AttnLayout lq,
              AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, bool causal, float scale) {
    constexpr int BKB = 64 * NWG;
    CUtensorMap mq, mk, mv, mdo;
    bool rq, rk, rv, rdo;
    if (!make_map(&mq, &rq, q, lq, B, H, T, D, BRB) || !make_map(&mk, &rk, k, lk, B, H, S, D, BKB) ||
        !make_map(&mv, &rv, v, lv, B, H, S, D, BKB) || !make_map(&mdo, &rdo, dout, lo, B, H, T, D, BRB))
        return false;
    CUtensorMap mdq{};  // (dQ by TMA) dq_acc (B H, T, D) float32, boxes of 16 rows x 32 columns
    if constexpr (Dq == kDqSplitTma) {
        const uint64_t dims[3] = {(uint64_t)D, (uint64_t)T, (uint64_t)B * H};
        const uint64_t strides[2] = {4 * (uint64_t)D, 4 * (uint64_t)T * D};
        const uint32_t box[3] = {32, 16, 1};
        if (!tma::encode_f32(&mdq, dq_acc, 3, dims, strides, box)) return false;
    }
    // K, V [kv_buffers](BKB, D); Q, dO [kStages]; dS^T a consumer; dQ's rows a consumer, and their sum; lse,
    // delta [kStages]; the mbarriers and the K/V buffers' items; slack to align the tiles to 1024 bytes
    constexpr int kKv = kv_buffers(D, Dq, BRB);
    const int bytes = (int)Panels<D>::tile_bytes(2 * kKv * BKB + 2 * kStages * BRB) +
                      ds_buffers(Dq) * NWG * BRB * 128 +
                      NWG * dq_staging_bytes(Dq, BRB) + (Dq == kDqSummed ? dq_sum_bytes(D) + 16 * NWG : 0) +
                      2 * kStages * BRB * 4 + 8 * (4 + 2 * kStages) + 2 * (int)sizeof(Item) + 1024;
    auto kernel = bwd_ws_kernel<D, NWG, Dq, BRB, Overlap>;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "attention_backward");
    // a block an item, or (dynamic) at most a block an SM walking the items
    const int64_t items = (int64_t)ceil_div(S, BKB) * B * H;
    if (kKv == 1) dynamic = false;  // a walk would reuse the one K/V buffer
    const unsigned grid = (unsigned)(dynamic ? std::min<int64_t>(items, sm_count(device)) : items);
    // The walk in groups of heads of at most 8 MB of Q and dO. On an H100, ms at B 16 T 1024 (H 12 D 64;
    // H 6 D 128) for groups of 8, 16 and 32 MB and a batch element's heads: D 64 0.275, 0.282, 0.311
    // against 0.289; D 128 0.286, 0.288, 0.291 against 0.307 (B 8 T 2048 D 64: 0.409, 0.404, 0.410
    // against 0.436)
    constexpr int kWalkGroupMb = 8;
    kernel<<<grid, (NWG + 1) * 128, bytes, st>>>(mq, mk, mv, mdo, mdq, (int)rq | (int)rk << 1 | (int)rv << 2 | (int)rdo << 3,
                                                 (bf16*)dk, (bf16*)dv, dq_acc, lse, delta, lk, lv, B, H, T, S, causal,
                                                 scale, scale * kLog2e, walk_group(B * H, 4LL * T * D, kWalkGroupMb),
                                                 dynamic ? walk_counter(g_next_item, counters) : nullptr);
    return true;
}

}  // namespace

// kernel: 1 three consumers, 2 two (a block an item); + 8 dQ by bulk reductions (head dim 64), + 32
// dQ summed in shared memory first (over + 8; at head dim 128 always a block an item, as K and V
// have one buffer there); + 64 dQ split by columns between the consumers (head dim 128 and two
// consumers only; added by atomics, or with + 8 by bulk reductions of rows, then a block an item as
// K and V have one buffer); + 128 query tiles of 128 with dQ split by query rows between the consumers
// (head dim 64 and two consumers only; atomics, or with + 8 bulk reductions and a block an item);
// + 256 FlashAttention-3's order of a tile's steps (kernels 57, 74 and those of + 128 only);
// + 16 persistent with a dynamic walk; + 2048 dQ by TMA tensor reductions of tiles staged in the other
// dS^T buffer (402 only: 2450) or, at head dim 128, in a staging of each consumer's own (330 only:
// 2378). (+ 1024, dQ's atomics four columns at a time, is gone: 0.322 ms against 402's 0.314 at
// gpt2_124m's shape; so is + 4, a persistent grid on a static stride: 0.42-0.54 ms against 0.32-0.38.)
bool attention_backward_ws(int kernel, int device, cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout,
                           const void* q, const void* k, const void* v, const float* lse, const float* delta,
                           AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S,
                           int D, bool causal, float scale) {
    const int variant = kernel & 3;
    if (kernel & 4) return false;
    const bool dynamic = kernel & 16;
    const bool rows128 = kernel & 128;  // query tiles of 128, dQ split by rows
    const int dq = kernel & (64 | 128) ? (kernel & 8 ? kDqSplit : kDqSplitAtomic)
                   : kernel & 32 ? kDqSummed : kernel & 8 ? kDqBulk : kDqAtomic;
    if (split_dq(dq) && (D != (rows128 ? 64 : 128) || variant != 2 || (kernel & 64 && rows128))) return false;
#define ARGS dynamic, device, st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal, scale
    if (kernel & 2048)
        return kernel == 2450 && D == 64    ? backward<64, 2, kDqSplitTma, 128, true>(ARGS)
               : kernel == 2378 && D == 128 ? backward<128, 2, kDqSplitTma, 64, true>(ARGS)
                                            : false;
    if (kernel & 256) {  // FlashAttention-3's order
        if (rows128)
            return dq == kDqSplit ? backward<64, 2, kDqSplit, 128, true>(ARGS)
                                  : backward<64, 2, kDqSplitAtomic, 128, true>(ARGS);
        if (D == 64 && variant == 1 && dq == kDqSummed) return backward<64, 3, kDqSummed, 64, true>(ARGS);
        if (D == 128 && variant == 2 && dq == kDqSplit) return backward<128, 2, kDqSplit, 64, true>(ARGS);
        return false;
    }
    if (rows128)
        return dq == kDqSplit ? backward<64, 2, kDqSplit, 128>(ARGS) : backward<64, 2, kDqSplitAtomic, 128>(ARGS);
    if (D == 64 && variant == 1)
        return dq == kDqSummed ? backward<64, 3, kDqSummed>(ARGS)
               : dq == kDqBulk ? backward<64, 3, kDqBulk>(ARGS) : backward<64, 3, kDqAtomic>(ARGS);
    if (D == 64 && variant == 2)
        return dq == kDqSummed ? backward<64, 2, kDqSummed>(ARGS)
               : dq == kDqBulk ? backward<64, 2, kDqBulk>(ARGS) : backward<64, 2, kDqAtomic>(ARGS);
    if (D == 128 && variant != 0)  // (two consumers: three would spill at 128)
        return dq == kDqSplit         ? backward<128, 2, kDqSplit>(ARGS)
               : dq == kDqSplitAtomic ? backward<128, 2, kDqSplitAtomic>(ARGS)
               : dq == kDqSummed      ? backward<128, 2, kDqSummed>(ARGS) : backward<128, 2, kDqAtomic>(ARGS);
#undef ARGS
    return false;
}

}  // namespace engine
