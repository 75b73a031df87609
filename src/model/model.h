/* model.h - the one in-memory description of a decoder-only transformer of
 * the llama family, whatever file format it came from, and its loader. */
#ifndef CLLM_MODEL_MODEL_H
#define CLLM_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"
#include "model/tensor.h"

enum rope_scaling {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR, /* positions divided by factor */
    ROPE_SCALING_LLAMA3, /* Llama 3.1 frequency-band scaling */
    ROPE_SCALING_FREQS,  /* each frequency divided by rope_freqs[i] (GGUF's rope_freqs.weight:
                          * how llama.cpp stores Llama 3.1's scaling) */
};

struct model_config {
    char arch[32]; /* "llama", "mistral", "qwen2", "qwen3" */
    int dim;       /* hidden_size */
    int hidden_dim; /* intermediate_size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int vocab_size;
    int max_seq; /* max_position_embeddings (context the model was trained on) */
    float norm_eps;
    float rope_theta;
    /* false: rotate-half pairs (i, i+d/2) as in HF/NeoX; true: interleaved
     * pairs (2i, 2i+1) as in llama2.c and llama.cpp's permuted llama GGUFs. */
    bool rope_interleaved;
    enum rope_scaling rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_orig_max_seq;
    const float *rope_freqs; /* ROPE_SCALING_FREQS: head_dim / 2 divisors, owned by the model */
    bool qkv_bias;   /* qwen2 */
    bool qk_norm;    /* qwen3: RMSNorm over each q/k head before RoPE */
    bool tied_embeddings;
    int sliding_window; /* 0: full attention; else attend to the last N positions */
    int bos_id, eos_id; /* -1 when unknown; eos_id is the first of eos_ids */
    int eos_ids[8];     /* every id that ends generation (HF allows a list) */
    int n_eos;
};

struct layer_weights {
    struct tensor attn_norm;          /* [dim] */
    struct tensor wq, wk, wv, wo;     /* [n_heads*hd, dim] ... [dim, n_heads*hd] */
    struct tensor bq, bk, bv;         /* optional biases */
    struct tensor q_norm, k_norm;     /* optional, [head_dim] */
    struct tensor ffn_norm;           /* [dim] */
    struct tensor w_gate, w_up, w_down;
};

struct mapping {
    void *addr;
    size_t len;
};

struct model {
    struct model_config cfg;
    struct tensor tok_embd;  /* [vocab, dim] */
    struct tensor out_norm;  /* [dim] */
    struct tensor lm_head;   /* [vocab, dim]; aliases tok_embd when tied */
    struct layer_weights *layers;
    char path[1024];         /* what was loaded, for messages */
    char format[16];         /* "safetensors", "gguf", "llama2c" */

    /* Ownership: every mmap and every heap buffer holding weights is listed
     * here and released by model_free. Norm vectors are converted to f32 at
     * load (they are tiny); matrices stay in their stored dtype. */
    struct mapping *maps;
    int n_maps, cap_maps;
    void **bufs;
    int n_bufs, cap_bufs;
};

/* Loads a Hugging Face directory (config.json + safetensors), a .gguf file or
 * a llama2.c checkpoint (a .bin file or a directory holding one). */
int model_load(struct model *m, const char *path, struct err *e);
void model_free(struct model *m);

/* Checks shapes against the config; loaders call it last. */
int model_validate(const struct model *m, struct err *e);

/* Fills derived defaults (head_dim, kv heads) and rejects impossible values. */
int model_config_finish(struct model_config *c, const char *src, struct err *e);

/* Parses a HF config.json into c. */
int model_config_parse_hf(struct model_config *c, const char *json_path, struct err *e);

/* Bytes read from weights per generated token (all matrices incl. lm_head). */
size_t model_weight_bytes_per_token(const struct model *m);

/* A layer's matrices, q, k, v, o, gate, up, down in that order (a model
 * without one leaves its tensor empty: tensor_present says so). */
#define LAYER_MATRICES 7
void layer_matrices(const struct layer_weights *w, const struct tensor *out[LAYER_MATRICES]);

/* Internal to model/: maps file read-only; fails naming the file when it
 * cannot be opened, is not a regular file, or is under min_size bytes
 * ("<file>: <what> (<n> bytes)"). */
int model_map_file(const char *file, size_t min_size, const char *what, void **base,
                   size_t *size, struct err *e);
/* Internal to model/: loaders register what they own. */
int model_own_map(struct model *m, void *addr, size_t len, struct err *e);
void *model_own_alloc(struct model *m, size_t bytes, struct err *e);
/* Converts a vector tensor (any dtype) to an owned f32 copy in place. */
int model_vec_to_f32(struct model *m, struct tensor *t, struct err *e);

int model_load_safetensors_dir(struct model *m, const char *dir, struct err *e);
int model_load_gguf(struct model *m, const char *file, struct err *e);
int model_load_llama2c(struct model *m, const char *path, struct err *e);

#endif
