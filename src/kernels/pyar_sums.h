// The rank-order sums: one pack (or one element) from every rank, summed in
// fp32 in rank order 0..W-1 and rounded to the element type, so every rank
// (and every algorithm) gets the same bits.  allreduce.cu, shards.cu and the
// row code of pyar_rows.h reduce with them.  They are apart from the
// protocol (pyar_protocol.h) because they touch no flag and wait for no peer.
#pragma once

#include "pyar_device.h"

namespace pyar {

template <typename T>
struct Lanes {
  static constexpr int kCount = 16 / sizeof(T);
};

// Sums one pack from every rank in rank order 0..W-1 in fp32, so every rank
// (and every algorithm) produces bitwise-identical results.
template <typename T, int W>
PYAR_DEVICE void sum_packs(const Pack16 (&v)[W], float (&acc)[Lanes<T>::kCount]) {
  constexpr int L = Lanes<T>::kCount;
  const T *first = reinterpret_cast<const T *>(&v[0]);
#pragma unroll
  for (int j = 0; j < L; ++j) acc[j] = Element<T>::to_float(first[j]);
#pragma unroll
  for (int r = 1; r < W; ++r) {
    const T *x = reinterpret_cast<const T *>(&v[r]);
#pragma unroll
    for (int j = 0; j < L; ++j) acc[j] += Element<T>::to_float(x[j]);
  }
}

// The sums rounded to T, as one pack.
template <typename T>
PYAR_DEVICE Pack16 round_sums(const float (&acc)[Lanes<T>::kCount]) {
  Pack16 out;
  T *o = reinterpret_cast<T *>(&out);
#pragma unroll
  for (int j = 0; j < Lanes<T>::kCount; ++j) o[j] = Element<T>::from_float(acc[j]);
  return out;
}

template <typename T, int W>
PYAR_DEVICE Pack16 reduce_pack(const Pack16 (&v)[W]) {
  float acc[Lanes<T>::kCount];
  sum_packs<T, W>(v, acc);
  return round_sums<T>(acc);
}

// Pack i of every rank's source, summed: all loads in flight first.
template <typename T, int W>
PYAR_DEVICE void load_and_sum(const Pack16 *const (&src)[W], uint64_t i,
                              float (&acc)[Lanes<T>::kCount]) {
  Pack16 v[W];
#pragma unroll
  for (int r = 0; r < W; ++r) v[r] = load_peer(src[r] + i);
  sum_packs<T, W>(v, acc);
}

template <typename T, int W>
PYAR_DEVICE Pack16 load_and_reduce(const Pack16 *const (&src)[W], uint64_t i) {
  float acc[Lanes<T>::kCount];
  load_and_sum<T, W>(src, i, acc);
  return round_sums<T>(acc);
}

// Element i (past the whole packs) of every rank's source, summed in the
// same order.
template <typename T, int W>
PYAR_DEVICE float sum_element(const Pack16 *const (&src)[W], uint64_t i) {
  float acc = 0.f;
#pragma unroll
  for (int r = 0; r < W; ++r) {
    const T *x = reinterpret_cast<const T *>(src[r]);
    acc = r == 0 ? Element<T>::to_float(x[i]) : acc + Element<T>::to_float(x[i]);
  }
  return acc;
}

}  // namespace pyar
