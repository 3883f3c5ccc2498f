// A fixed pool of worker threads with deterministic work splitting.
//
// parallel_for(n, grain, fn) cuts [0, n) into at most num_threads() contiguous chunks whose bounds
// depend only on n, grain and the thread count, never on timing. A kernel that reduces per chunk and
// then combines the chunk results in chunk order therefore gives bit-identical results run after run
// for a given thread count. Calls made from inside a chunk run serially in the calling thread.
#pragma once
#include <cstdint>
#include <functional>

namespace lt {

int num_threads();
// Sets the pool size (>= 1). 0 means "all hardware threads". Not to be called from inside a chunk.
void set_num_threads(int threads);

using ChunkFn = std::function<void(int64_t begin, int64_t end)>;
// Runs fn over [0, n) in chunks of at least `grain` items (the last may be shorter).
void parallel_for(int64_t n, int64_t grain, const ChunkFn& fn);
// The same, telling fn which chunk it runs (for per-chunk partial results combined in chunk order).
using IndexedChunkFn = std::function<void(int64_t chunk, int64_t begin, int64_t end)>;
void parallel_for_chunks(int64_t n, int64_t grain, const IndexedChunkFn& fn);
// The chunk bounds parallel_for would use: chunk c covers [chunk_begin(c), chunk_begin(c + 1)).
int64_t num_chunks(int64_t n, int64_t grain);
int64_t chunk_begin(int64_t n, int64_t chunks, int64_t c);

}  // namespace lt
