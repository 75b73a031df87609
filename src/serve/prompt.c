/* prompt.c - turns a chat request's messages into prompt text: the model's
 * chat template when it has one, else a plain "role: content\n" transcript
 * ending in "assistant:" (the sample models carry no template). */
#include <string.h>

#include "serve/internal.h"
#include "tokenizer/chat_template.h"

static int render_plain(const json_t *messages, char **out, size_t *len, struct err *e)
{
    struct buf b = {0};
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *content = json_object_get(m, "content");
        buf_puts(&b, role ? role : "user");
        buf_puts(&b, ": ");
        if (json_is_string(content))
            buf_putn(&b, json_string_value(content), json_string_length(content));
        buf_puts(&b, "\n");
    }
    buf_puts(&b, "assistant:");
    if (b.oom) {
        buf_free(&b);
        return err_set(e, "out of memory rendering the prompt");
    }
    *out = b.p;
    *len = b.n;
    return 0;
}

int prompt_render(const struct served_model *sm, const json_t *messages, const json_t *tools,
                  const json_t *kwargs, char **out, size_t *len, bool *add_special,
                  struct err *e)
{
    if (!sm->tmpl) { /* tools and kwargs have nowhere to go in a plain transcript */
        *add_special = true;
        return render_plain(messages, out, len, e);
    }
    /* As transformers' apply_chat_template: the template writes BOS itself,
     * so the text is tokenized without adding special tokens. */
    *add_special = false;
    struct chat_template_input in = {.messages = messages,
                                     .tools = tools && json_array_size(tools) ? tools : NULL,
                                     .add_generation_prompt = true,
                                     .kwargs = kwargs};
    *out = chat_template_apply(sm->tmpl, &in, len, e);
    return *out ? 0 : -1;
}
