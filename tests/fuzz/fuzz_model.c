/* fuzz_model.c - libFuzzer target: arbitrary bytes as a model file load or
 * are refused with a message naming the file; never a crash, a hang or a
 * tensor reaching past what the file holds (every byte of a loaded model's
 * tensors is read, so ASan sees any such reach).
 * A GGUF's tokenizer is loaded too (tok_load_gguf_file: its vocabulary,
 * merges and token types come from the same file) and encodes a text.
 * The first byte picks the format: 0 a .gguf file, 1 a llama2.c .bin
 * checkpoint, 2 a Hugging Face directory, whose config.json (its length in
 * the next two bytes, little-endian) and model.safetensors (the rest)
 * share the input. tests/fuzz/model_seeds.py writes a tiny model of each:
 *   python3 tests/fuzz/model_seeds.py /tmp/seeds
 *   build-fuzz/fuzz_model /tmp/corpus /tmp/seeds -max_total_time=300
 * The files go to a directory of its own under $TMPDIR (or /tmp): fuzz_tmp.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_tmp.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[512], hf_dir[600];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tmpdir("fuzz_model", dir, sizeof dir);
    snprintf(hf_dir, sizeof hf_dir, "%s/hf", dir);
    return 0;
}

/* Reads every byte of t's rows; a sum the compiler cannot drop. */
static unsigned touch(const struct tensor *t)
{
    if (!tensor_present(t))
        return 0;
    const uint8_t *p = t->data;
    const size_t n = dtype_row_bytes(t->dtype, t->cols) * (size_t)t->rows;
    unsigned s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char path[700], file[700];
    const int kind = data[0] % 3;
    data++, size--;
    if (kind == 0) {
        snprintf(path, sizeof path, "%s/m.gguf", dir);
        fuzz_put(path, data, size);
    } else if (kind == 1) {
        snprintf(path, sizeof path, "%s/m.bin", dir);
        fuzz_put(path, data, size);
    } else {
        if (size < 2)
            return 0;
        size_t cl = data[0] | (size_t)data[1] << 8;
        data += 2, size -= 2;
        cl = cl < size ? cl : size;
        snprintf(path, sizeof path, "%s", hf_dir);
        if (access(hf_dir, F_OK) != 0 && mkdir(hf_dir, 0700) != 0) {
            perror(hf_dir);
            abort();
        }
        snprintf(file, sizeof file, "%s/config.json", hf_dir);
        fuzz_put(file, data, cl);
        snprintf(file, sizeof file, "%s/model.safetensors", hf_dir);
        fuzz_put(file, data + cl, size - cl);
    }
    struct err e = {{0}};
    if (kind == 0) {
        struct tokenizer *t = tok_load_gguf_file(path, &e);
        if (t) {
            int *ids = NULL;
            static const char text[] = "ab cd\n<|end|> e\xc3\xa9 \xf0\x9f\x98\x80";
            const int n = tok_encode(t, text, sizeof text - 1, true, &ids, &e);
            char *d = n >= 0 ? tok_decode(t, ids, n, false, &e) : NULL;
            free(d);
            free(ids);
            tok_free(t);
        } else if (!strstr(e.msg, dir) || strchr(e.msg, '\n')) {
            fprintf(stderr, "fuzz_model: a vocabulary refusal that names no file: \"%s\"\n", e.msg);
            abort();
        }
    }
    struct model m;
    if (model_load(&m, path, &e) != 0) {
        /* one line naming what was read: the file or the directory */
        if (!strstr(e.msg, dir) || strchr(e.msg, '\n')) {
            fprintf(stderr, "fuzz_model: a refusal that names no file: \"%s\"\n", e.msg);
            abort();
        }
        return 0;
    }
    unsigned s = touch(&m.tok_embd) + touch(&m.out_norm) + touch(&m.lm_head);
    for (int l = 0; l < m.cfg.n_layers; l++) {
        const struct tensor *mats[LAYER_MATRICES];
        layer_matrices(&m.layers[l], mats);
        for (int k = 0; k < LAYER_MATRICES; k++)
            s += touch(mats[k]);
        const struct layer_weights *w = &m.layers[l];
        s += touch(&w->attn_norm) + touch(&w->ffn_norm) + touch(&w->q_norm) + touch(&w->k_norm) +
             touch(&w->bq) + touch(&w->bk) + touch(&w->bv);
    }
    if (s == 0x5eed5eedu) /* keeps the reads */
        fputc(0, stderr);
    model_free(&m);
    return 0;
}
