/* config.c - reads a Hugging Face config.json (llama, mistral, qwen2, qwen3)
 * into struct model_config, including transformers 4.x `rope_scaling` and
 * 5.x `rope_parameters`. */
#include "model/model.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static int get_int(json_t *o, const char *key, int def)
{
    json_t *v = json_object_get(o, key);
    if (json_is_integer(v))
        return (int)json_integer_value(v);
    if (json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0)))
        return (int)json_integer_value(json_array_get(v, 0)); /* eos lists */
    return def;
}

static double get_num(json_t *o, const char *key, double def)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : def;
}

static int get_bool(json_t *o, const char *key, int def)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static int parse_rope(struct model_config *c, json_t *rope, const char *path, struct err *e)
{
    if (!json_is_object(rope))
        return 0;
    c->rope_theta = (float)get_num(rope, "rope_theta", c->rope_theta);
    const char *type = json_string_value(json_object_get(rope, "rope_type"));
    if (!type)
        type = json_string_value(json_object_get(rope, "type"));
    if (!type || strcmp(type, "default") == 0)
        return 0;
    c->rope_factor = (float)get_num(rope, "factor", 1.0);
    if (strcmp(type, "llama3") == 0) {
        c->rope_scaling = ROPE_SCALING_LLAMA3;
        c->rope_low_freq_factor = (float)get_num(rope, "low_freq_factor", 1.0);
        c->rope_high_freq_factor = (float)get_num(rope, "high_freq_factor", 4.0);
        c->rope_orig_max_seq = get_int(rope, "original_max_position_embeddings", 8192);
    } else if (strcmp(type, "linear") == 0) {
        c->rope_scaling = ROPE_SCALING_LINEAR;
    } else {
        return err_set(e, "%s: rope scaling type \"%s\" is not supported (supported: default, "
                          "linear, llama3)", path, type);
    }
    return 0;
}

int model_config_parse_hf(struct model_config *c, const char *path, struct err *e)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return err_set(e, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
    int rc = -1;
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) {
        err_set(e, "%s: expected a JSON object", path);
        goto out;
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!mt) {
        err_set(e, "%s: no \"model_type\"", path);
        goto out;
    }
    if (strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "qwen2") && strcmp(mt, "qwen3")) {
        err_set(e, "%s: model_type \"%s\" is not supported (supported: llama, mistral, qwen2, qwen3)",
                path, mt);
        goto out;
    }
    snprintf(c->arch, sizeof c->arch, "%s", mt);
    c->dim = get_int(root, "hidden_size", 0);
    c->hidden_dim = get_int(root, "intermediate_size", 0);
    c->n_layers = get_int(root, "num_hidden_layers", 0);
    c->n_heads = get_int(root, "num_attention_heads", 0);
    c->n_kv_heads = get_int(root, "num_key_value_heads", c->n_heads);
    c->head_dim = get_int(root, "head_dim", 0);
    c->vocab_size = get_int(root, "vocab_size", 0);
    c->max_seq = get_int(root, "max_position_embeddings", 0);
    c->norm_eps = (float)get_num(root, "rms_norm_eps", 1e-6);
    c->rope_theta = (float)get_num(root, "rope_theta", 10000.0);
    c->tied_embeddings = get_bool(root, "tie_word_embeddings", 0);
    c->bos_id = get_int(root, "bos_token_id", -1);
    c->eos_id = get_int(root, "eos_token_id", -1);
    json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_array(eos)) {
        for (size_t i = 0; i < json_array_size(eos) && c->n_eos < 8; i++)
            if (json_is_integer(json_array_get(eos, i)))
                c->eos_ids[c->n_eos++] = (int)json_integer_value(json_array_get(eos, i));
    } else if (c->eos_id >= 0) {
        c->eos_ids[c->n_eos++] = c->eos_id;
    }
    c->qkv_bias = strcmp(mt, "qwen2") == 0;
    c->qk_norm = strcmp(mt, "qwen3") == 0;
    if (parse_rope(c, json_object_get(root, "rope_scaling"), path, e) ||
        parse_rope(c, json_object_get(root, "rope_parameters"), path, e))
        goto out;
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu")) {
        err_set(e, "%s: hidden_act \"%s\" is not supported (only silu)", path, act);
        goto out;
    }
    if (get_bool(root, "mlp_bias", 0) || (strcmp(mt, "llama") == 0 && get_bool(root, "attention_bias", 0))) {
        err_set(e, "%s: mlp_bias / attention_bias on o_proj are not supported", path);
        goto out;
    }
    int sw = get_int(root, "sliding_window", 0);
    if (strcmp(mt, "mistral") == 0 && sw > 0)
        c->sliding_window = sw;
    if (strcmp(mt, "qwen2") == 0 && get_bool(root, "use_sliding_window", 0)) {
        err_set(e, "%s: qwen2 use_sliding_window is not supported", path);
        goto out;
    }
    rc = model_config_finish(c, path, e);
out:
    json_decref(root);
    return rc;
}
