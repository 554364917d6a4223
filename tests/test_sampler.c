/* test_sampler.c -- sampling against hand-derived expectations: greedy is
 * argmax; temperature draws follow the softmax (chi-square over 40k draws);
 * top-k, top-p and min-p keep exactly the sets their definitions give;
 * the repetition penalty divides positive and multiplies negative logits;
 * a seed reproduces a sequence; no allocation per call. Stop strings:
 * text is cut exactly before the first stop string however the pieces
 * split it, and nothing that could begin one is emitted early. */
#include "base/base.h"
#include "test.h"

static rlm_sampler *make(rlm_sampler_params p, int vocab) {
  rlm_sampler *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_sampler_create(&s, &p, vocab, &err), RLM_OK);
  return s;
}

/* Counts of n draws from logits l[V] (copied each time: sampling edits). */
static void draw(rlm_sampler *s, const float *l, int V, int n, int *counts) {
  float buf[16];
  for (int i = 0; i < V; i++) counts[i] = 0;
  for (int k = 0; k < n; k++) {
    memcpy(buf, l, (size_t)V * sizeof *buf);
    int32_t id = rlm_sampler_sample(s, buf);
    if (id >= 0 && id < V) counts[id]++;
  }
}

static const float L[6] = {1.0f, 3.0f, 2.0f, -1.0f, 2.5f, 0.0f};

TEST(greedy_is_argmax) {
  rlm_sampler *s = make(rlm_sampler_params_default(), 6);
  float l[6];
  memcpy(l, L, sizeof l);
  CHECK_EQ(rlm_sampler_sample(s, l), 1);
  rlm_sampler_free(s);
}

TEST(temperature_follows_softmax) {
  rlm_sampler_params p = rlm_sampler_params_default();
  p.temp = 0.7f, p.seed = 42;
  rlm_sampler *s = make(p, 6);
  int counts[6], n = 40000;
  draw(s, L, 6, n, counts);
  double z = 0, e[6], chi2 = 0;
  for (int i = 0; i < 6; i++) z += (e[i] = exp(L[i] / 0.7));
  for (int i = 0; i < 6; i++) {
    double want = n * e[i] / z;
    chi2 += (counts[i] - want) * (counts[i] - want) / want;
  }
  test_note("chi2 %.2f", chi2);
  CHECK(chi2 < 20.5); /* 5 degrees of freedom, p = 0.001 */
  rlm_sampler_free(s);
}

TEST(top_k_top_p_min_p_sets) {
  rlm_sampler_params p = rlm_sampler_params_default();
  p.temp = 1.0f, p.seed = 7, p.top_k = 2;
  rlm_sampler *s = make(p, 6);
  int c[6];
  draw(s, L, 6, 5000, c);
  CHECK(c[1] > 0 && c[4] > 0 && c[1] + c[4] == 5000); /* the two largest */
  rlm_sampler_free(s);
  /* Probabilities at temp 1: 3 -> .4495, 2.5 -> .2726, 2 -> .1654, ...
   * top_p 0.6: the smallest prefix reaching 0.6 is {1, 4}. */
  p.top_k = 0, p.top_p = 0.6f;
  s = make(p, 6);
  draw(s, L, 6, 5000, c);
  CHECK(c[1] + c[4] == 5000 && c[4] > 0);
  rlm_sampler_free(s);
  /* min_p 0.3: keep p >= 0.3 * 0.4495 = 0.135: ids 1, 4, 2. */
  p.top_p = 1.0f, p.min_p = 0.3f;
  s = make(p, 6);
  draw(s, L, 6, 5000, c);
  CHECK(c[1] + c[4] + c[2] == 5000 && c[2] > 0);
  rlm_sampler_free(s);
}

TEST(repetition_penalty) {
  rlm_sampler_params p = rlm_sampler_params_default();
  p.repeat_penalty = 2.0f, p.repeat_last_n = 4;
  rlm_sampler *s = make(p, 6);
  rlm_sampler_accept(s, 1);
  rlm_sampler_accept(s, 1); /* counted once */
  rlm_sampler_accept(s, 3);
  float l[6];
  memcpy(l, L, sizeof l);
  CHECK_EQ(rlm_sampler_sample(s, l), 4); /* 3 / 2 = 1.5 < 2.5 */
  CHECK(l[1] == 1.5f && l[3] == -2.0f && l[4] == 2.5f);
  for (int i = 0; i < 4; i++) rlm_sampler_accept(s, 5); /* 1 and 3 leave the window */
  memcpy(l, L, sizeof l);
  CHECK_EQ(rlm_sampler_sample(s, l), 1);
  rlm_sampler_free(s);
}

TEST(seed_reproduces_and_no_allocation) {
  rlm_sampler_params p = rlm_sampler_params_default();
  p.temp = 1.0f, p.top_p = 0.9f, p.seed = 1234;
  rlm_sampler *a = make(p, 6), *b = make(p, 6);
  int same = 0;
  uint64_t before = rlm__alloc_count();
  for (int k = 0; k < 200; k++) {
    float la[6], lb[6];
    memcpy(la, L, sizeof la), memcpy(lb, L, sizeof lb);
    same += rlm_sampler_sample(a, la) == rlm_sampler_sample(b, lb);
  }
  CHECK_EQ(rlm__alloc_count() - before, 0);
  CHECK_EQ(same, 200);
  rlm_sampler_free(a), rlm_sampler_free(b);
  rlm_sampler *s;
  rlm_error err;
  p.top_p = 0;
  CHECK_EQ(rlm_sampler_create(&s, &p, 6, &err), RLM_ERR_INVALID);
  CHECK(s == NULL);
  p.top_p = 1, p.temp = -1;
  CHECK_EQ(rlm_sampler_create(&s, &p, 6, &err), RLM_ERR_INVALID);
  rlm_sampler_free(NULL);
}

/* Streams `pieces` through a matcher; returns what was emitted (flushed at
 * the end unless stopped) and whether a stop string was hit. */
static bool stream(const char *const *stops, int n_stops, const char *const *pieces, int n, char *out,
                   size_t cap) {
  rlm_stop *st = NULL;
  rlm_error err;
  CHECK_EQ(rlm_stop_create(&st, stops, n_stops, &err), RLM_OK);
  size_t used = 0;
  bool stopped = false;
  const char *e;
  size_t el;
  for (int i = 0; st && i < n && !stopped; i++) {
    CHECK_EQ(rlm_stop_push(st, pieces[i], strlen(pieces[i]), &e, &el, &stopped, &err), RLM_OK);
    CHECK(used + el < cap);
    memcpy(out + used, e, el), used += el;
  }
  if (st && !stopped) rlm_stop_flush(st, &e, &el), memcpy(out + used, e, el), used += el;
  out[used] = 0;
  rlm_stop_free(st);
  return stopped;
}

TEST(stop_strings) {
  char out[256];
  static const char *const stops[] = {"<end>", "\n\nUser:"};
  static const char *const p1[] = {"Hello", " wor", "ld<e", "nd>more"};
  CHECK(stream(stops, 2, p1, 4, out, sizeof out));
  CHECK_STR_EQ(out, "Hello world");
  static const char *const p2[] = {"a\n", "\nUs", "e", "r: x"}; /* split over four pieces */
  CHECK(stream(stops, 2, p2, 4, out, sizeof out));
  CHECK_STR_EQ(out, "a");
  static const char *const p3[] = {"<en", "d", "ing>", " and <", "e"}; /* false starts: all text */
  CHECK(!stream(stops, 2, p3, 5, out, sizeof out));
  CHECK_STR_EQ(out, "<ending> and <e");
  static const char *const p4[] = {"caf\xc3\xa9 <", "end>"}; /* UTF-8 kept whole */
  CHECK(stream(stops, 2, p4, 2, out, sizeof out));
  CHECK_STR_EQ(out, "caf\xc3\xa9 ");
  CHECK(!stream(NULL, 0, p1, 4, out, sizeof out)); /* no stop strings: everything */
  CHECK_STR_EQ(out, "Hello world<end>more");
  /* Held back, not emitted early: "<e" could begin "<end>". */
  rlm_stop *st;
  rlm_error err;
  const char *e;
  size_t el;
  bool stopped;
  CHECK_EQ(rlm_stop_create(&st, stops, 2, &err), RLM_OK);
  CHECK_EQ(rlm_stop_push(st, "ab<e", 4, &e, &el, &stopped, &err), RLM_OK);
  CHECK(!stopped && el == 2 && !memcmp(e, "ab", 2));
  uint64_t before = rlm__alloc_count();
  for (int i = 0; i < 100; i++) CHECK_EQ(rlm_stop_push(st, "xyz ", 4, &e, &el, &stopped, &err), RLM_OK);
  CHECK_EQ(rlm__alloc_count() - before, 0);
  rlm_stop_free(st);
  static const char *const empty[] = {""};
  CHECK_EQ(rlm_stop_create(&st, empty, 1, &err), RLM_ERR_INVALID);
}

int main(void) {
  RUN(greedy_is_argmax);
  RUN(temperature_follows_softmax);
  RUN(top_k_top_p_min_p_sets);
  RUN(repetition_penalty);
  RUN(seed_reproduces_and_no_allocation);
  RUN(stop_strings);
  return test_summary();
}
