/* dispatch.cuh -- what the .cu files of src/cuda share: picking the
 * kernel instantiation for a run-time row count. Kernels take the rows of
 * x (m, 1..8) as a template parameter so that their accumulators stay in
 * registers; CALL(MM) launches the one for MM. */
#ifndef RLM_CUDA_DISPATCH_CUH
#define RLM_CUDA_DISPATCH_CUH

#define RLM_CUDA_FOR_M(m, CALL) \
  switch (m) {                  \
  case 1: CALL(1); break;       \
  case 2: CALL(2); break;       \
  case 3: CALL(3); break;       \
  case 4: CALL(4); break;       \
  case 5: CALL(5); break;       \
  case 6: CALL(6); break;       \
  case 7: CALL(7); break;       \
  default: CALL(8); break;      \
  }

#endif /* RLM_CUDA_DISPATCH_CUH */
