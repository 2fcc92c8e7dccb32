/* Uses tilejit from C through its installed C header only (compiled as C99,
 * pedantic, warnings as errors): the consumer's gemm with bias and relu,
 * exact in fp32, and the errors a C caller gets instead of an exception. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <tilejit/tilejit_c.h>

static uint16_t bf16(float f) { /* exact for the small integers used here */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

static int expect_error(tilejit_status s, const char* needle, const char* what) {
  if (s == TILEJIT_ERROR && strstr(tilejit_last_error(), needle) != NULL) return 0;
  fprintf(stderr, "%s: status %s, message \"%s\"; expected an error naming \"%s\"\n", what,
          tilejit_status_name(s), tilejit_last_error(), needle);
  return 1;
}

int main(void) {
  enum { M = 2, N = 3, K = 4 };
  uint16_t x[M * K], w[N * K];
  float bias[N] = {1, 2, -100}, y[M * N];
  const float want[M * N] = {11, 22, 0, 0, 0, 0};
  int64_t xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N}, bs[1] = {N};
  tilejit_tensor xt = {NULL, TILEJIT_BF16, 2, NULL, NULL}, wt = xt, yt = xt, bt = xt;
  tilejit_packed_weight* pw = NULL;
  tilejit_packed_weight_info info;
  tilejit_gemm_options opt, unset;
  tilejit_cpu_info cpu;
  int i, k, bad = 0;

  for (i = 0; i < M; ++i)
    for (k = 0; k < K; ++k) x[i * K + k] = bf16((float)((i == 0 ? 1 : -1) * (k + 1)));
  for (i = 0; i < N; ++i)
    for (k = 0; k < K; ++k) w[i * K + k] = bf16((float)(i + 1));
  for (i = 0; i < M * N; ++i) y[i] = -1.0f;
  xt.data = x;
  xt.shape = xs;
  wt.data = w;
  wt.shape = ws;
  yt.data = y;
  yt.dtype = TILEJIT_F32;
  yt.shape = ys;
  bt.data = bias;
  bt.dtype = TILEJIT_F32;
  bt.ndim = 1;
  bt.shape = bs;

  if (tilejit_c_api_version() != TILEJIT_C_API_VERSION ||
      tilejit_pack_weight_bf16(&wt, &pw) != TILEJIT_OK ||
      tilejit_packed_weight_get_info(pw, &info) != TILEJIT_OK || info.n != N || info.k != K) {
    fprintf(stderr, "packing failed: %s\n", tilejit_last_error());
    return 1;
  }
  tilejit_gemm_options_init(&opt);
  opt.bias = &bt;
  opt.act = TILEJIT_ACT_RELU;
  if (tilejit_gemm(&xt, pw, &yt, &opt) != TILEJIT_OK) {
    fprintf(stderr, "gemm failed: %s\n", tilejit_last_error());
    return 1;
  }
  for (i = 0; i < M * N; ++i)
    if (y[i] != want[i]) {
      fprintf(stderr, "y[%d] = %g, expected %g\n", i, y[i], want[i]);
      ++bad;
    }

  /* The errors a C caller can make, each a status and a message. */
  xt.dtype = TILEJIT_F32;
  bad += expect_error(tilejit_gemm(&xt, pw, &yt, NULL), "x.dtype=f32", "a bad dtype");
  xt.dtype = TILEJIT_BF16;
  memset(&unset, 0, sizeof unset);
  bad += expect_error(tilejit_gemm(&xt, pw, &yt, &unset), "tilejit_gemm_options_init",
                      "options not set up by their init function");
  bad += expect_error(tilejit_gemm(&xt, NULL, &yt, NULL), "w is NULL", "a NULL weight");

  if (strcmp(tilejit_status_name((tilejit_status)7), "unknown status") != 0) ++bad;
  /* An enum argument outside its values: an error naming it (a C caller may pass any int). */
  {
    int64_t es[3] = {1, 2, K}; /* within w */
    tilejit_tensor et = {w, TILEJIT_BF16, 3, es, NULL};
    tilejit_packed_experts* pe = NULL;
    bad += expect_error(
        tilejit_pack_experts_bf16(&et, (tilejit_expert_proj)9, TILEJIT_GLU_HALVES, &pe), "9",
        "an expert projection outside the enum");
    if (pe != NULL) ++bad;
  }
  if (tilejit_get_cpu_info(&cpu) != TILEJIT_OK) ++bad;
  printf("tilejit C consumer: vendor %s, layout %s, %s\n", cpu.vendor, info.layout,
         bad ? "FAILED" : "ok");
  tilejit_packed_weight_destroy(pw); /* info.layout dies with it */
  tilejit_packed_weight_destroy(NULL);
  return bad ? 1 : 0;
}
