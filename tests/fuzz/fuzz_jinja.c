/* fuzz_jinja.c - libFuzzer target for the Jinja interpreter: compiles any
 * bytes as a template and renders it with a fixed chat-like context under
 * tight limits. A crash, hang, leak or sanitizer report is a bug; a
 * template error is not. Built only with -DCLLM_FUZZ=ON (clang). */
#include <stdint.h>
#include <stdlib.h>

#include "tokenizer/jinja.h"

static const char *const CONTEXT =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9\\ud83e\\udd99 <|im_end|>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>x</think>ok\", \"tool_calls\": [{\"id\": \"abcdefghi\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true], \"b\": {}}}}]},"
    " {\"role\": \"tool\", \"content\": [{\"type\": \"text\", \"text\": \"r\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\":"
    " {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": false, \"n\": -9223372036854775807, \"f\": 1e308}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars;
    if (!vars) {
        json_error_t je;
        vars = json_loads(CONTEXT, 0, &je);
        if (!vars)
            abort();
    }
    struct err e;
    struct jinja_template *t = jinja_compile((const char *)data, size, &e);
    if (!t)
        return 0;
    struct jinja_render_opts o = {
        .limits = {.max_steps = 200000, .max_memory = 64u << 20, .max_output = 1u << 20,
                   .max_call_depth = 40},
        .now = 1700000000,
    };
    size_t len;
    char *out = jinja_render(t, vars, &o, &len, &e);
    free(out);
    jinja_free(t);
    return 0;
}
