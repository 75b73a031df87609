/* test_chat_template.c - chat templates end to end: every Jinja2 render in
 * ../shared/tokenizers/<name>/chat_template_cases.json and every
 * transformers.apply_chat_template render in
 * tests/fixtures/tokenizers/<name>/template_cases.json must come out byte
 * for byte; hand-written templates in the style of Llama 3.1 (tools,
 * "Cutting Knowledge Date"), Mistral ([INST], role checks), Phi-3,
 * SmolLM/ChatML and Qwen2.5 (tools) render what Jinja2 renders (the
 * expected texts were made with Jinja2 3.1.6 set up like transformers);
 * and templates are found the way transformers finds them (named
 * templates, chat_template.jinja, AddedToken special tokens, GGUF). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "tokenizer/chat_template.h"

/* ---- the shared Jinja2 renders and the transformers fixtures ---- */

/* Runs one case object: messages, tools, add_generation_prompt, kwargs (or
 * extra_kwargs), and rendered or error. Returns true when it matches. */
static bool run_case(const struct chat_template *ct, const json_t *c, const char *file)
{
    const json_t *kw = json_object_get(c, "kwargs");
    if (!kw)
        kw = json_object_get(c, "extra_kwargs");
    const json_t *tools = json_object_get(c, "tools");
    struct chat_template_input in = {
        .messages = json_object_get(c, "messages"),
        .tools = json_is_array(tools) ? tools : NULL,
        .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
        .kwargs = json_is_object(kw) ? kw : NULL,
    };
    const char *name = json_string_value(json_object_get(c, "name"));
    const json_t *want = json_object_get(c, "rendered");
    const json_t *want_err = json_object_get(c, "error");
    struct err e = {{0}};
    size_t len = 0;
    char *out = chat_template_apply(ct, &in, &len, &e);
    bool ok;
    if (json_is_string(want_err)) {
        ok = !out && strstr(e.msg, json_string_value(want_err));
        CHECK(ok, "%s: %s: want error \"%s\", got %s", file, name, json_string_value(want_err),
              out ? out : e.msg);
    } else {
        ok = out && json_is_string(want) && len == json_string_length(want) &&
             !memcmp(out, json_string_value(want), len);
        CHECK(ok, "%s: %s:\n  want: %s\n  got:  %s", file, name,
              json_is_string(want) ? json_string_value(want) : "(no \"rendered\")",
              out ? out : e.msg);
    }
    free(out);
    return ok;
}

static void run_file(const char *tokdir, const char *file, const char *label)
{
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root) {
        printf("%s: %s missing, skipped\n", label, file);
        return;
    }
    struct err e = {{0}};
    struct chat_template *ct = chat_template_load(tokdir, &e);
    CHECK(ct != NULL, "%s: %s", tokdir, e.msg);
    const json_t *cases = json_is_array(root) ? root : json_object_get(root, "cases");
    int pass = 0, n = 0;
    size_t i;
    json_t *c;
    if (ct)
        json_array_foreach(cases, i, c) {
            n++;
            pass += run_case(ct, c, file);
        }
    printf("%s: %d of %d cases render identically\n", label, pass, n);
    chat_template_free(ct);
    json_decref(root);
}

static void test_real_tokenizers(void)
{
    static const char *const names[] = {"qwen3", "llama3_1", "gemma3"};
    char dir[1024], file[1200], label[256];
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        snprintf(dir, sizeof dir, "%s/tokenizers/%s", CLLM_SHARED_DIR, names[k]);
        snprintf(file, sizeof file, "%s/chat_template_cases.json", dir);
        snprintf(label, sizeof label, "%s (Jinja2, shared)", names[k]);
        run_file(dir, file, label);
        snprintf(file, sizeof file, "%s/tokenizers/%s/template_cases.json", CLLM_FIXTURES_DIR,
                 names[k]);
        snprintf(label, sizeof label, "%s (transformers, fixtures)", names[k]);
        run_file(dir, file, label);
    }
    /* mistral's tokenizer ships no template */
    struct err e = {{0}};
    char dir2[1024];
    snprintf(dir2, sizeof dir2, "%s/tokenizers/mistral", CLLM_SHARED_DIR);
    struct chat_template *ct = chat_template_load(dir2, &e);
    CHECK(!ct && strstr(e.msg, "no chat template"), "mistral: %s", ct ? "loaded" : e.msg);
    chat_template_free(ct);
}

/* ---- hand-written templates in the style of popular models ---- */

static const struct {
    const char *name, *special, *src;
} templates[] = {
    {"llama31",
     "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\"}",
     "{{- bos_token }}\n"
     "{%- if custom_tools is defined %}\n"
     "    {%- set tools = custom_tools %}\n"
     "{%- endif %}\n"
     "{%- if not tools_in_user_message is defined %}\n"
     "    {%- set tools_in_user_message = true %}\n"
     "{%- endif %}\n"
     "{%- if not date_string is defined %}\n"
     "    {%- set date_string = \"26 Jul 2024\" %}\n"
     "{%- endif %}\n"
     "{%- if not tools is defined %}\n"
     "    {%- set tools = none %}\n"
     "{%- endif %}\n"
     "\n"
     "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
     "{%- if messages[0]['role'] == 'system' %}\n"
     "    {%- set system_message = messages[0]['content']|trim %}\n"
     "    {%- set messages = messages[1:] %}\n"
     "{%- else %}\n"
     "    {%- set system_message = \"\" %}\n"
     "{%- endif %}\n"
     "\n"
     "{#- System message + builtin tools #}\n"
     "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
     "{%- if builtin_tools is defined or tools is not none %}\n"
     "    {{- \"Environment: ipython\\n\" }}\n"
     "{%- endif %}\n"
     "{%- if builtin_tools is defined %}\n"
     "    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n"
     "{%- endif %}\n"
     "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
     "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
     "{%- if tools is not none and not tools_in_user_message %}\n"
     "    {{- \"You have access to the following functions. To call a function, please respond with JSON for a function call.\" }}\n"
     "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n"
     "    {{- \"Do not use variables.\\n\\n\" }}\n"
     "    {%- for t in tools %}\n"
     "        {{- t | tojson(indent=4) }}\n"
     "        {{- \"\\n\\n\" }}\n"
     "    {%- endfor %}\n"
     "{%- endif %}\n"
     "{{- system_message }}\n"
     "{{- \"<|eot_id|>\" }}\n"
     "\n"
     "{#- Custom tools are passed in a user message with some extra guidance #}\n"
     "{%- if tools_in_user_message and not tools is none %}\n"
     "    {#- Extract the first user message so we can plug it in here #}\n"
     "    {%- if messages | length != 0 %}\n"
     "        {%- set first_user_message = messages[0]['content']|trim %}\n"
     "        {%- set messages = messages[1:] %}\n"
     "    {%- else %}\n"
     "        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}\n"
     "{%- endif %}\n"
     "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
     "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
     "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
     "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n"
     "    {{- \"Do not use variables.\\n\\n\" }}\n"
     "    {%- for t in tools %}\n"
     "        {{- t | tojson(indent=4) }}\n"
     "        {{- \"\\n\\n\" }}\n"
     "    {%- endfor %}\n"
     "    {{- first_user_message + \"<|eot_id|>\"}}\n"
     "{%- endif %}\n"
     "\n"
     "{%- for message in messages %}\n"
     "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
     "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
     "    {%- elif 'tool_calls' in message %}\n"
     "        {%- if not message.tool_calls|length == 1 %}\n"
     "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n"
     "        {%- endif %}\n"
     "        {%- set tool_call = message.tool_calls[0].function %}\n"
     "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
     "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
     "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
     "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n"
     "                {{- arg_name + '=\"' + arg_val + '\"' }}\n"
     "                {%- if not loop.last %}\n"
     "                    {{- \", \" }}\n"
     "                {%- endif %}\n"
     "                {%- endfor %}\n"
     "            {{- \")\" }}\n"
     "        {%- else  %}\n"
     "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
     "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
     "            {{- '\"parameters\": ' }}\n"
     "            {{- tool_call.arguments | tojson }}\n"
     "            {{- \"}\" }}\n"
     "        {%- endif %}\n"
     "        {%- if builtin_tools is defined %}\n"
     "            {#- This means we're in ipython mode #}\n"
     "            {{- \"<|eom_id|>\" }}\n"
     "        {%- else %}\n"
     "            {{- \"<|eot_id|>\" }}\n"
     "        {%- endif %}\n"
     "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
     "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
     "        {%- if message.content is mapping or message.content is iterable %}\n"
     "            {{- message.content | tojson }}\n"
     "        {%- else %}\n"
     "            {{- message.content }}\n"
     "        {%- endif %}\n"
     "        {{- \"<|eot_id|>\" }}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n"
     "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
     "{%- endif %}\n"},
    {"mistral",
     "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}",
     "{%- if messages[0][\"role\"] == \"system\" %}\n"
     "    {%- set system_message = messages[0][\"content\"] %}\n"
     "    {%- set loop_messages = messages[1:] %}\n"
     "{%- else %}\n"
     "    {%- set loop_messages = messages %}\n"
     "{%- endif %}\n"
     "{%- if not tools is defined %}\n"
     "    {%- set tools = none %}\n"
     "{%- endif %}\n"
     "{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n"
     "\n"
     "{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n"
     "{%- set ns = namespace() %}\n"
     "{%- set ns.index = 0 %}\n"
     "{%- for message in loop_messages %}\n"
     "    {%- if not (message.role == \"tool\" or message.role == \"tool_results\" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n"
     "        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n"
     "            {{- raise_exception(\"After the optional system message, conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
     "        {%- endif %}\n"
     "        {%- set ns.index = ns.index + 1 %}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"
     "\n"
     "{{- bos_token }}\n"
     "{%- for message in loop_messages %}\n"
     "    {%- if message[\"role\"] == \"user\" %}\n"
     "        {%- if tools is not none and (message == user_messages[-1]) %}\n"
     "            {{- \"[AVAILABLE_TOOLS] [\" }}\n"
     "            {%- for tool in tools %}\n"
     "                {%- set tool = tool.function %}\n"
     "                {{- '{\"type\": \"function\", \"function\": {' }}\n"
     "                {%- for key, val in tool.items() if key != \"return\" %}\n"
     "                    {%- if val is string %}\n"
     "                        {{- '\"' + key + '\": \"' + val + '\"' }}\n"
     "                    {%- else %}\n"
     "                        {{- '\"' + key + '\": ' + val|tojson }}\n"
     "                    {%- endif %}\n"
     "                    {%- if not loop.last %}\n"
     "                        {{- \", \" }}\n"
     "                    {%- endif %}\n"
     "                {%- endfor %}\n"
     "                {{- \"}}\" }}\n"
     "                {%- if not loop.last %}\n"
     "                    {{- \", \" }}\n"
     "                {%- else %}\n"
     "                    {{- \"]\" }}\n"
     "                {%- endif %}\n"
     "            {%- endfor %}\n"
     "            {{- \"[/AVAILABLE_TOOLS]\" }}\n"
     "            {%- endif %}\n"
     "        {%- if loop.last and system_message is defined %}\n"
     "            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
     "        {%- else %}\n"
     "            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n"
     "        {%- endif %}\n"
     "    {%- elif message.tool_calls is defined and message.tool_calls is not none %}\n"
     "        {{- \"[TOOL_CALLS] [\" }}\n"
     "        {%- for tool_call in message.tool_calls %}\n"
     "            {%- set out = tool_call.function|tojson %}\n"
     "            {{- out[:-1] }}\n"
     "            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n"
     "                {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n"
     "            {%- endif %}\n"
     "            {{- ', \"id\": \"' + tool_call.id + '\"}' }}\n"
     "            {%- if not loop.last %}\n"
     "                {{- \", \" }}\n"
     "            {%- else %}\n"
     "                {{- \"]\" + eos_token }}\n"
     "            {%- endif %}\n"
     "        {%- endfor %}\n"
     "    {%- elif message[\"role\"] == \"assistant\" %}\n"
     "        {{- \" \" + message[\"content\"]|trim + eos_token}}\n"
     "    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n"
     "        {%- if message.content is defined and message.content.content is defined %}\n"
     "            {%- set content = message.content.content %}\n"
     "        {%- else %}\n"
     "            {%- set content = message.content %}\n"
     "        {%- endif %}\n"
     "        {{- '[TOOL_RESULTS] {\"content\": ' + content|string + \", \" }}\n"
     "        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n"
     "            {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n"
     "        {%- endif %}\n"
     "        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n"
     "    {%- else %}\n"
     "        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of an initial optional system message!\") }}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"},
    {"phi3",
     "{\"bos_token\": \"<s>\", \"eos_token\": \"<|endoftext|>\"}",
     "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n"
     "' + message['content'] + '<|end|>\n"
     "'}}{% elif message['role'] == 'user' %}{{'<|user|>\n"
     "' + message['content'] + '<|end|>\n"
     "'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n"
     "' + message['content'] + '<|end|>\n"
     "'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n"
     "' }}{% else %}{{ eos_token }}{% endif %}\n"},
    {"smollm",
     "{\"bos_token\": \"<|im_start|>\", \"eos_token\": \"<|im_end|>\"}",
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
     "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
     "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
     "' + message['content'] + '<|im_end|>' + '\n"
     "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
     "' }}{% endif %}\n"},
    {"qwen25",
     "{\"eos_token\": \"<|im_end|>\", \"pad_token\": \"<|endoftext|>\"}",
     "{%- if tools %}\n"
     "    {{- '<|im_start|>system\\n' }}\n"
     "    {%- if messages[0]['role'] == 'system' %}\n"
     "        {{- messages[0]['content'] }}\n"
     "    {%- else %}\n"
     "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
     "    {%- endif %}\n"
     "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
     "    {%- for tool in tools %}\n"
     "        {{- \"\\n\" }}\n"
     "        {{- tool | tojson }}\n"
     "    {%- endfor %}\n"
     "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
     "{%- else %}\n"
     "    {%- if messages[0]['role'] == 'system' %}\n"
     "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
     "    {%- else %}\n"
     "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
     "    {%- endif %}\n"
     "{%- endif %}\n"
     "{%- for message in messages %}\n"
     "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
     "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
     "    {%- elif message.role == \"assistant\" %}\n"
     "        {{- '<|im_start|>' + message.role }}\n"
     "        {%- if message.content %}\n"
     "            {{- '\\n' + message.content }}\n"
     "        {%- endif %}\n"
     "        {%- for tool_call in message.tool_calls %}\n"
     "            {%- if tool_call.function is defined %}\n"
     "                {%- set tool_call = tool_call.function %}\n"
     "            {%- endif %}\n"
     "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
     "            {{- tool_call.name }}\n"
     "            {{- '\", \"arguments\": ' }}\n"
     "            {{- tool_call.arguments | tojson }}\n"
     "            {{- '}\\n</tool_call>' }}\n"
     "        {%- endfor %}\n"
     "        {{- '<|im_end|>\\n' }}\n"
     "    {%- elif message.role == \"tool\" %}\n"
     "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
     "            {{- '<|im_start|>user' }}\n"
     "        {%- endif %}\n"
     "        {{- '\\n<tool_response>\\n' }}\n"
     "        {{- message.content }}\n"
     "        {{- '\\n</tool_response>' }}\n"
     "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
     "            {{- '<|im_end|>\\n' }}\n"
     "        {%- endif %}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n"
     "    {{- '<|im_start|>assistant\\n' }}\n"
     "{%- endif %}\n"},
};

static const struct {
    const char *tpl, *name, *chat, *want, *err;
} styled[] = {
    {"llama31", "tools_in_user_message",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a bot.\"}, {\"role\": \"user\", \"content\": \"Weather in Zürich\?\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}], \"add_generation_prompt\": true}",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
     "\n"
     "Environment: ipython\n"
     "Cutting Knowledge Date: December 2023\n"
     "Today Date: 26 Jul 2024\n"
     "\n"
     "You are a bot.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\n"
     "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n"
     "\n"
     "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n"
     "\n"
     "{\n"
     "    \"type\": \"function\",\n"
     "    \"function\": {\n"
     "        \"name\": \"get_weather\",\n"
     "        \"description\": \"Get the weather in a city.\",\n"
     "        \"parameters\": {\n"
     "            \"type\": \"object\",\n"
     "            \"properties\": {\n"
     "                \"city\": {\n"
     "                    \"type\": \"string\",\n"
     "                    \"description\": \"City name, e.g. Zürich\"\n"
     "                },\n"
     "                \"unit\": {\n"
     "                    \"type\": \"string\",\n"
     "                    \"enum\": [\n"
     "                        \"celsius\",\n"
     "                        \"fahrenheit\"\n"
     "                    ]\n"
     "                }\n"
     "            },\n"
     "            \"required\": [\n"
     "                \"city\"\n"
     "            ]\n"
     "        }\n"
     "    }\n"
     "}\n"
     "\n"
     "Weather in Zürich\?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n",
     NULL},
    {"llama31", "tools_in_system",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris\?\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}], \"add_generation_prompt\": true, \"kwargs\": {\"tools_in_user_message\": false, \"date_string\": \"01 Jan 2025\"}}",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
     "\n"
     "Environment: ipython\n"
     "Cutting Knowledge Date: December 2023\n"
     "Today Date: 01 Jan 2025\n"
     "\n"
     "You have access to the following functions. To call a function, please respond with JSON for a function call.Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n"
     "\n"
     "{\n"
     "    \"type\": \"function\",\n"
     "    \"function\": {\n"
     "        \"name\": \"get_weather\",\n"
     "        \"description\": \"Get the weather in a city.\",\n"
     "        \"parameters\": {\n"
     "            \"type\": \"object\",\n"
     "            \"properties\": {\n"
     "                \"city\": {\n"
     "                    \"type\": \"string\",\n"
     "                    \"description\": \"City name, e.g. Zürich\"\n"
     "                },\n"
     "                \"unit\": {\n"
     "                    \"type\": \"string\",\n"
     "                    \"enum\": [\n"
     "                        \"celsius\",\n"
     "                        \"fahrenheit\"\n"
     "                    ]\n"
     "                }\n"
     "            },\n"
     "            \"required\": [\n"
     "                \"city\"\n"
     "            ]\n"
     "        }\n"
     "    }\n"
     "}\n"
     "\n"
     "<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\n"
     "Weather in Paris\?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n",
     NULL},
    {"llama31", "tool_call_and_result",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris\?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 18}\"}, {\"role\": \"assistant\", \"content\": \"It is 18 degrees.\"}], \"add_generation_prompt\": false}",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
     "\n"
     "Cutting Knowledge Date: December 2023\n"
     "Today Date: 26 Jul 2024\n"
     "\n"
     "<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\n"
     "Weather in Paris\?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n"
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n"
     "\n"
     "\"{\\\"temp\\\": 18}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n"
     "It is 18 degrees.<|eot_id|>",
     NULL},
    {"llama31", "builtin_tool_call",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Search for llamas\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"brave_search\", \"arguments\": {\"query\": \"llamas\"}}}]}, {\"role\": \"ipython\", \"content\": {\"results\": [\"a\", \"b\"]}}], \"add_generation_prompt\": true, \"kwargs\": {\"builtin_tools\": [\"brave_search\", \"code_interpreter\"]}}",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
     "\n"
     "Environment: ipython\n"
     "Tools: brave_search\n"
     "\n"
     "Cutting Knowledge Date: December 2023\n"
     "Today Date: 26 Jul 2024\n"
     "\n"
     "<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\n"
     "Search for llamas<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n"
     "<|python_tag|>brave_search.call(query=\"llamas\")<|eom_id|><|start_header_id|>ipython<|end_header_id|>\n"
     "\n"
     "{\"results\": [\"a\", \"b\"]}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n",
     NULL},
    {"llama31", "two_tool_calls_error",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"a\", \"arguments\": {}}}, {\"function\": {\"name\": \"b\", \"arguments\": {}}}]}], \"add_generation_prompt\": true}",
     NULL,
     "This model only supports single tool-calls at once!"},
    {"mistral", "tools_last_user",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", \"content\": \"Weather in Paris\?\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}], \"add_generation_prompt\": true}",
     "<s>[INST] Hi[/INST] Hello!</s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST] Be brief.\n"
     "\n"
     "Weather in Paris\?[/INST]",
     NULL},
    {"mistral", "tool_call_ids",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris\?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"abc123XYZ\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 18}\", \"tool_call_id\": \"abc123XYZ\"}, {\"role\": \"assistant\", \"content\": \"  18 degrees. \"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}], \"add_generation_prompt\": false}",
     "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST] Weather in Paris\?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123XYZ\"}]</s>[TOOL_RESULTS] {\"content\": {\"temp\": 18}, \"call_id\": \"abc123XYZ\"}[/TOOL_RESULTS] 18 degrees.</s>",
     NULL},
    {"mistral", "roles_must_alternate",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}], \"add_generation_prompt\": true}",
     NULL,
     "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
    {"mistral", "bad_tool_call_id",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"short\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}}]}], \"add_generation_prompt\": true}",
     NULL,
     "Tool call IDs should be alphanumeric strings with length 9!"},
    {"phi3", "multi_turn_genprompt",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", \"content\": \"How are you\?\"}], \"add_generation_prompt\": true}",
     "<|system|>\n"
     "You are helpful.<|end|>\n"
     "<|user|>\n"
     "Hi<|end|>\n"
     "<|assistant|>\n"
     "Hello!<|end|>\n"
     "<|user|>\n"
     "How are you\?<|end|>\n"
     "<|assistant|>\n",
     NULL},
    {"phi3", "no_genprompt_eos",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}], \"add_generation_prompt\": false}",
     "<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|endoftext|>",
     NULL},
    {"smollm", "default_system",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2\?\"}], \"add_generation_prompt\": true}",
     "<|im_start|>system\n"
     "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
     "<|im_start|>user\n"
     "What is 2+2\?<|im_end|>\n"
     "<|im_start|>assistant\n",
     NULL},
    {"smollm", "own_system",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Be terse.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hey.\"}], \"add_generation_prompt\": false}",
     "<|im_start|>system\n"
     "Be terse.<|im_end|>\n"
     "<|im_start|>user\n"
     "Hi<|im_end|>\n"
     "<|im_start|>assistant\n"
     "Hey.<|im_end|>\n",
     NULL},
    {"qwen25", "no_tools_default_system",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"add_generation_prompt\": true}",
     "<|im_start|>system\n"
     "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
     "<|im_start|>user\n"
     "Hello<|im_end|>\n"
     "<|im_start|>assistant\n",
     NULL},
    {"qwen25", "tools_calls_responses",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a weather bot.\"}, {\"role\": \"user\", \"content\": \"Paris and Rome\?\"}, {\"role\": \"assistant\", \"content\": \"Checking.\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"celsius\"}}}]}, {\"role\": \"tool\", \"content\": \"18\"}, {\"role\": \"tool\", \"content\": \"25\"}, {\"role\": \"assistant\", \"content\": \"Paris 18, Rome 25.\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}], \"add_generation_prompt\": true}",
     "<|im_start|>system\n"
     "You are a weather bot.\n"
     "\n"
     "# Tools\n"
     "\n"
     "You may call one or more functions to assist with the user query.\n"
     "\n"
     "You are provided with function signatures within <tools></tools> XML tags:\n"
     "<tools>\n"
     "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}\n"
     "</tools>\n"
     "\n"
     "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
     "<tool_call>\n"
     "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
     "</tool_call><|im_end|>\n"
     "<|im_start|>user\n"
     "Paris and Rome\?<|im_end|>\n"
     "<|im_start|>assistant\n"
     "Checking.\n"
     "<tool_call>\n"
     "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
     "</tool_call>\n"
     "<tool_call>\n"
     "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"celsius\"}}\n"
     "</tool_call><|im_end|>\n"
     "<|im_start|>user\n"
     "<tool_response>\n"
     "18\n"
     "</tool_response>\n"
     "<tool_response>\n"
     "25\n"
     "</tool_response><|im_end|>\n"
     "<|im_start|>assistant\n"
     "Paris 18, Rome 25.<|im_end|>\n"
     "<|im_start|>assistant\n",
     NULL},
};

static void test_styled(void)
{
    for (size_t i = 0; i < sizeof styled / sizeof styled[0]; i++) {
        const char *src = NULL, *special = NULL;
        for (size_t k = 0; k < sizeof templates / sizeof templates[0]; k++)
            if (!strcmp(templates[k].name, styled[i].tpl)) {
                src = templates[k].src;
                special = templates[k].special;
            }
        json_error_t je;
        json_t *config = json_loads(special, 0, &je);
        json_t *chat = json_loads(styled[i].chat, 0, &je);
        struct err e = {{0}};
        struct chat_template *ct = chat_template_from_source(src, config, &e);
        CHECK(ct != NULL, "%s: %s", styled[i].tpl, e.msg);
        if (ct && chat) {
            json_t *c = json_deep_copy(chat);
            json_object_set_new(c, "name", json_string(styled[i].name));
            if (styled[i].want)
                json_object_set_new(c, "rendered", json_string(styled[i].want));
            else
                json_object_set_new(c, "error", json_string(styled[i].err));
            run_case(ct, c, styled[i].tpl);
            json_decref(c);
        }
        chat_template_free(ct);
        json_decref(config);
        json_decref(chat);
    }
}

/* ---- finding templates ---- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static char *apply(const struct chat_template *ct, const char *messages, const char *tools,
                   const char *kwargs, const char *name, struct err *e)
{
    json_error_t je;
    json_t *m = json_loads(messages, 0, &je);
    json_t *t = tools ? json_loads(tools, 0, &je) : NULL;
    json_t *k = kwargs ? json_loads(kwargs, 0, &je) : NULL;
    struct chat_template_input in = {.messages = m, .tools = t, .kwargs = k,
                                     .add_generation_prompt = true, .template_name = name};
    size_t len;
    char *out = chat_template_apply(ct, &in, &len, e);
    json_decref(m);
    json_decref(t);
    json_decref(k);
    return out;
}

static void expect_apply(const struct chat_template *ct, const char *messages, const char *tools,
                         const char *kwargs, const char *name, const char *want)
{
    struct err e = {{0}};
    char *out = apply(ct, messages, tools, kwargs, name, &e);
    CHECK(out && !strcmp(out, want), "want %s, got %s", want, out ? out : e.msg);
    free(out);
}

static void test_loading(void)
{
    char dir[] = "/tmp/cllm_ct_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    char path[256];
    /* a list of named templates and AddedToken special tokens; a null
     * pad_token is not passed at all (undefined, not None) */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path,
               "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\", \"lstrip\": false},"
               " \"eos_token\": \"</s>\", \"pad_token\": null, \"model_max_length\": 1000000000000000019884624838656,"
               " \"additional_special_tokens\": [\"<a>\", {\"content\": \"<b>\"}],"
               " \"chat_template\": ["
               "  {\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ eos_token }}{{ pad_token is defined }}{{ additional_special_tokens }}{{ messages|length }}{{ tools }}\"},"
               "  {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}{{ documents }}{{ add_generation_prompt }}\"}]}");
    struct err e = {{0}};
    struct chat_template *ct = chat_template_load(dir, &e);
    CHECK(ct != NULL, "load named templates: %s", e.msg);
    if (ct) {
        CHECK(chat_template_count(ct) == 2 && !strcmp(chat_template_name(ct, 1), "tool_use"),
              "two named templates");
        expect_apply(ct, "[{\"role\": \"user\", \"content\": \"x\"}]", NULL, NULL, NULL,
                     "D<s></s>False['<a>', '<b>']1None");
        expect_apply(ct, "[]", "[{\"a\": 1}]", NULL, NULL, "T1NoneTrue");
        expect_apply(ct, "[]", "[{\"a\": 1}]", NULL, "default", "D<s></s>False['<a>', '<b>']0[{'a': 1}]");
        expect_apply(ct, "[]", NULL, "{\"bos_token\": \"B\"}", NULL, "DB</s>False['<a>', '<b>']0None");
        char *out = apply(ct, "[]", NULL, NULL, "nope", &e);
        CHECK(!out && strstr(e.msg, "no chat template named 'nope'"), "unknown name: %s", e.msg);
        free(out);
        out = apply(ct, "[]", NULL, "{\"messages\": []}", NULL, &e);
        CHECK(!out && strstr(e.msg, "may not set 'messages'"), "reserved kwarg: %s", e.msg);
        free(out);
        out = apply(ct, "{\"role\": \"user\"}", NULL, NULL, NULL, &e);
        CHECK(!out && strstr(e.msg, "messages must be a JSON array"), "messages object: %s", e.msg);
        free(out);
        CHECK(!strncmp(chat_template_source(ct, NULL, false), "D{{", 3), "default source");
        CHECK(!strncmp(chat_template_source(ct, NULL, true), "T{{", 3),
              "with tools, the source apply picks: tool_use");
        chat_template_free(ct);
    }
    /* chat_template.jinja overrides the config, as in transformers */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    write_file(path, "{% for m in messages %}[{{ m.role }}]{% endfor %}{{ bos_token }}\n");
    ct = chat_template_load(dir, &e);
    CHECK(ct != NULL, "load chat_template.jinja: %s", e.msg);
    if (ct) {
        CHECK(chat_template_count(ct) == 1, "chat_template.jinja only");
        expect_apply(ct, "[{\"role\": \"user\", \"content\": \"x\"}]", "[]", NULL, NULL, "[user]<s>");
        chat_template_free(ct);
    }
    /* a syntax error names the template and the line */
    write_file(path, "ok\n{% if %}\n");
    ct = chat_template_load(dir, &e);
    CHECK(!ct && strstr(e.msg, "chat template 'default'") && strstr(e.msg, "template line 2"),
          "syntax error: %s", ct ? "loaded" : e.msg);
    chat_template_free(ct);
    unlink(path);
    /* tokenizer_config.json given as a file; a chat_template string */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, "{\"eos_token\": \"E\", \"chat_template\": \"{{ eos_token }}{{ messages[0].content }}\"}");
    ct = chat_template_load(path, &e);
    CHECK(ct != NULL, "load by file: %s", e.msg);
    if (ct) {
        expect_apply(ct, "[{\"role\": \"user\", \"content\": \"x\"}]", NULL, NULL, NULL, "Ex");
        chat_template_free(ct);
    }
    /* no template anywhere */
    write_file(path, "{\"eos_token\": \"E\"}");
    ct = chat_template_load(dir, &e);
    CHECK(!ct && strstr(e.msg, "no chat template"), "no template: %s", ct ? "loaded" : e.msg);
    chat_template_free(ct);
    /* chat_template.json (processor style) */
    char cpath[256];
    snprintf(cpath, sizeof cpath, "%s/chat_template.json", dir);
    write_file(cpath, "{\"chat_template\": \"J{{ eos_token }}\"}");
    ct = chat_template_load(dir, &e);
    CHECK(ct != NULL, "chat_template.json: %s", e.msg);
    if (ct) {
        expect_apply(ct, "[]", NULL, NULL, NULL, "JE");
        chat_template_free(ct);
    }
    unlink(cpath);
    unlink(path);
    rmdir(dir);
    ct = chat_template_load("/nonexistent/model", &e);
    CHECK(!ct && strstr(e.msg, "no such file"), "missing path: %s", e.msg);
    /* GGUF metadata: tokenizer.chat_template and the BOS token's text */
    char gguf[1024];
    snprintf(gguf, sizeof gguf, "%s/testdata/tokenizer-vectors/ggml-vocab-phi-3.gguf", CLLM_SHARED_DIR);
    struct stat st;
    if (stat(gguf, &st) == 0) {
        ct = chat_template_load(gguf, &e);
        CHECK(ct != NULL, "gguf: %s", e.msg);
        if (ct) {
            expect_apply(ct,
                         "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"},"
                         " {\"role\": \"user\", \"content\": \"Bye\"}]",
                         NULL, NULL, NULL,
                         "<s><|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n");
            chat_template_free(ct);
        }
    }
}

int main(void)
{
    test_real_tokenizers();
    test_styled();
    test_loading();
    return test_summary("test_chat_template");
}
