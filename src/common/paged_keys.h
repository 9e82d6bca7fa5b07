// Where key position j of one sequence lives in a key/value cache: the page-table extension of the sequence
// policy (common/sequence.h). A contiguous cache (batch_cache, seqlen_cache, heads_kv, head_dim) is the case of
// one page per sequence (its cache row) of seqlen_cache rows; a paged cache (num_pages, page_size, heads_kv,
// head_dim) maps j through the sequence's row of the block table. Both answer (slot, row): the index into the
// cache's first and second dimensions. Packed keys (total_k, heads_kv, head_dim) are the contiguous case of one
// slot whose sequences start at their own first row.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

struct CacheRow {
  int64_t slot = 0;  // cache batch row (contiguous) or page (paged)
  int64_t row = 0;   // position inside it
};

struct PagedKeys {
  const int* block_table = nullptr;  // this sequence's row of the page table; null = contiguous
  int64_t slot = 0;                  // contiguous: the sequence's cache row (already clamped)
  int64_t first_row = 0;             // contiguous: the row of key 0 in the slot (packed keys: the sequence's offset)
  int64_t page_size = 0;             // paged: rows per page; contiguous: seqlen_cache
  int64_t max_pages = 1;             // entries in the block table row (contiguous: 1)
  int64_t num_slots = 1;             // pages in the pool (paged) or batch_cache (contiguous)
  int page_shift = -1;               // paged: log2(page_size) when it is a power of two (a shift, not a division)

  // Device-resident page numbers cannot be checked without a synchronisation, so they are clamped to
  // [0, num_slots - 1]: a bad table reads a wrong page, never outside the pool. j must be < capacity().
  FLASH4_HD CacheRow at(int64_t j) const {
    if (block_table == nullptr) return {slot, first_row + j};
    const int64_t page = page_shift >= 0 ? j >> page_shift : j / page_size;
    const int64_t row = j - page * page_size;
    return {clamp_slot(block_table[page > max_pages - 1 ? max_pages - 1 : page]), row};
  }
  // Whether keys a <= b (both < capacity()) are rows of one page: one lookup then serves both and every key
  // between them, at consecutive rows.
  FLASH4_HD bool same_page(int64_t a, int64_t b) const {
    if (block_table == nullptr) return true;
    return page_shift >= 0 ? (a >> page_shift) == (b >> page_shift) : a / page_size == b / page_size;
  }
  // Keys the sequence can hold.
  FLASH4_HD int64_t capacity() const { return block_table == nullptr ? page_size - first_row : page_size * max_pages; }

  FLASH4_HD static PagedKeys contiguous(int64_t slot, int64_t seqlen_cache, int64_t batch_cache,
                                        int64_t first_row = 0) {
    PagedKeys k;
    k.slot = slot;
    k.first_row = first_row;
    k.page_size = seqlen_cache;
    k.num_slots = batch_cache;
    return k;
  }
  FLASH4_HD static PagedKeys paged(const int* table_row, int64_t page_size, int64_t max_pages, int64_t num_pages,
                                   int page_shift = -1) {
    PagedKeys k;
    k.page_shift = page_shift;
    k.block_table = table_row;
    k.page_size = page_size;
    k.max_pages = max_pages;
    k.num_slots = num_pages;
    return k;
  }

 private:
  FLASH4_HD int64_t clamp_slot(int64_t s) const { return s < 0 ? 0 : s > num_slots - 1 ? num_slots - 1 : s; }
};

}  // namespace flash4::detail
