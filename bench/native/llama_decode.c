/* Plain decoding over libllama (llama.cpp's C API), the native anchor of bench/peers.py.
 *
 * llama.cpp ships no plain-decoding tool that takes a thread count and token ids and reports the prefill and
 * the decode apart (llama-simple runs on its default thread count and tokenizes text itself), so this is the
 * smallest such loop, written against llama.h alone: one llama_decode of the prompt, then one llama_decode per
 * token, sampling with llama.cpp's own samplers (greedy at temperature 0, else temperature then a seeded
 * draw over the whole vocabulary: top-k, top-p and min-p off, as in our runs).
 *
 *   llama_decode MODEL.gguf THREADS MAX_NEW TEMPERATURE SEED < prompt_ids.txt
 *
 * stdin: the prompt's token ids, whitespace-separated (the same ids our engine decodes). stdout: one JSON
 * object: tokens (the reply, EOS included when it ends the reply), prefill_s (the prompt's llama_decode),
 * first_s (prompt in, first token out), decode_s (the rest of the reply), total_s. Timed after a warm-up
 * decode of the prompt's first token whose cache is then cleared, so page faults of the mapped weights are
 * not counted (our engine's weights are warm in its long-running process as well). Exit 2 on bad arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL.gguf THREADS MAX_NEW TEMPERATURE SEED < prompt_ids.txt\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[2]), max_new = atoi(argv[3]);
    const float temperature = (float)atof(argv[4]);
    const unsigned seed = (unsigned)strtoul(argv[5], NULL, 10);
    if (threads < 1 || max_new < 1 || temperature < 0.f) {
        fprintf(stderr, "error: THREADS and MAX_NEW must be >= 1 and TEMPERATURE >= 0\n");
        return 2;
    }
    int capacity = 4096, n_prompt = 0;
    llama_token *prompt = malloc(sizeof(llama_token) * (size_t)capacity);
    long id;
    while (prompt != NULL && scanf("%ld", &id) == 1) {
        if (n_prompt == capacity) prompt = realloc(prompt, sizeof(llama_token) * (size_t)(capacity *= 2));
        if (prompt != NULL) prompt[n_prompt++] = (llama_token)id;
    }
    if (prompt == NULL || n_prompt == 0) {
        fprintf(stderr, "error: no prompt token ids on stdin\n");
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params model_params = llama_model_default_params();
    model_params.n_gpu_layers = 0;
    /* no repacked weight copies: with them ggml's AMX path crashes on this file on the benchmark machine
     * (a segfault in ggml_backend_amx_mul_mat, llama-cpp-python 0.3.36's llama.cpp); llama-server runs with
     * --no-repack in bench/serve.py for the same reason */
    model_params.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], model_params);
    if (model == NULL) {
        fprintf(stderr, "error: cannot load %s\n", argv[1]);
        return 2;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    struct llama_context_params ctx_params = llama_context_default_params();
    ctx_params.n_ctx = (uint32_t)(n_prompt + max_new + 8);
    ctx_params.n_batch = (uint32_t)n_prompt;
    ctx_params.n_ubatch = (uint32_t)n_prompt;
    ctx_params.n_threads = threads;
    ctx_params.n_threads_batch = threads;
    struct llama_context *ctx = llama_init_from_model(model, ctx_params);
    if (ctx == NULL) {
        fprintf(stderr, "error: cannot create a context\n");
        return 1;
    }
    struct llama_sampler *sampler = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (temperature == 0.f) {
        llama_sampler_chain_add(sampler, llama_sampler_init_greedy());
    } else {
        llama_sampler_chain_add(sampler, llama_sampler_init_temp(temperature));
        llama_sampler_chain_add(sampler, llama_sampler_init_dist(seed));
    }
    /* warm-up: touch every weight once, then forget it */
    if (llama_decode(ctx, llama_batch_get_one(prompt, 1)) != 0) return 1;
    llama_memory_clear(llama_get_memory(ctx), true);

    llama_token *reply = malloc(sizeof(llama_token) * (size_t)max_new);
    if (reply == NULL) return 1;
    int n_reply = 0;
    const double start = now_s();
    if (llama_decode(ctx, llama_batch_get_one(prompt, n_prompt)) != 0) return 1;
    const double prefilled = now_s();
    llama_token token = llama_sampler_sample(sampler, ctx, -1);
    reply[n_reply++] = token;
    const double first = now_s();
    while (n_reply < max_new && !llama_vocab_is_eog(vocab, token)) {
        if (llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0) return 1;
        token = llama_sampler_sample(sampler, ctx, -1);
        reply[n_reply++] = token;
    }
    const double end = now_s();
    printf("{\"tokens\": [");
    for (int i = 0; i < n_reply; ++i) printf(i ? ", %d" : "%d", reply[i]);
    printf("], \"prefill_s\": %.6f, \"first_s\": %.6f, \"decode_s\": %.6f, \"total_s\": %.6f}\n",
           prefilled - start, first - start, end - first, end - start);
    free(reply);
    free(prompt);
    llama_sampler_free(sampler);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
