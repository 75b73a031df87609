// tools.mjs - tool calls and reasoning through the official OpenAI and
// Anthropic SDKs, against a cllm serve of the scripted Qwen3 fixture
// (gen_fixture.mjs --script), which always writes
//   <think>Checking.</think>Sure!<tool_call>{"name":"get_weather","arguments":{"days":3}}</tool_call>
// Chat completions, Messages and Responses, each non-streamed and streamed,
// must split it the same way; without tools the call stays text; a cut-off
// call comes back as text; the calls go back in as history.
//
//   node tools.mjs <base url>
//
// Prints one line; exits 1 when any check failed.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import assert from 'node:assert';

const [base] = process.argv.slice(2);
let pass = 0, fail = 0;
const check = (cond, what) => {
  if (cond) pass++;
  else { fail++; console.error(`FAIL [tools]: ${what}`); }
};
const same = (a, b) => { try { assert.deepStrictEqual(a, b); return true; } catch { return false; } };

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const fn = { name: 'get_weather', description: 'The forecast', parameters: { type: 'object', properties: { days: { type: 'integer' } } } };
const messages = [{ role: 'user', content: 'Weather for the next days?' }];
const args = { days: 3 };

try {
  // ---- chat completions ----
  const c = await openai.chat.completions.create({ model: 'm', messages, tools: [{ type: 'function', function: fn }],
    tool_choice: 'auto', parallel_tool_calls: true, temperature: 0 });
  const m = c.choices[0].message;
  check(m.reasoning_content === 'Checking.', `chat reasoning_content ${JSON.stringify(m)}`);
  check(m.content === 'Sure!', `chat content ${JSON.stringify(m.content)}`);
  check(m.tool_calls?.length === 1 && m.tool_calls[0].type === 'function' && m.tool_calls[0].id.startsWith('call_') &&
    m.tool_calls[0].function.name === 'get_weather' && same(JSON.parse(m.tool_calls[0].function.arguments), args),
    `chat tool_calls ${JSON.stringify(m.tool_calls)}`);
  check(c.choices[0].finish_reason === 'tool_calls', `chat finish_reason ${c.choices[0].finish_reason}`);

  const s = await openai.chat.completions.create({ model: 'm', messages, tools: [{ type: 'function', function: fn }],
    temperature: 0, stream: true });
  let reasoning = '', content = '', finish = null;
  const calls = [];
  for await (const ch of s)
    for (const choice of ch.choices) {
      reasoning += choice.delta?.reasoning_content ?? '';
      content += choice.delta?.content ?? '';
      for (const tc of choice.delta?.tool_calls ?? []) {
        calls[tc.index] ??= { id: '', name: '', arguments: '' };
        calls[tc.index].id += tc.id ?? '';
        calls[tc.index].name += tc.function?.name ?? '';
        calls[tc.index].arguments += tc.function?.arguments ?? '';
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  check(reasoning === 'Checking.' && content === 'Sure!', `chat stream text ${reasoning} / ${content}`);
  check(calls.length === 1 && calls[0].id.startsWith('call_') && calls[0].name === 'get_weather' &&
    same(JSON.parse(calls[0].arguments), args), `chat stream tool_calls ${JSON.stringify(calls)}`);
  check(finish === 'tool_calls', `chat stream finish_reason ${finish}`);

  // no tools in the request: the call is the model's text, finish "stop"
  const plain = await openai.chat.completions.create({ model: 'm', messages, temperature: 0 });
  check(plain.choices[0].message.content === 'Sure!<tool_call>{"name":"get_weather","arguments":{"days":3}}</tool_call>' &&
    !plain.choices[0].message.tool_calls && plain.choices[0].finish_reason === 'stop',
    `chat without tools ${JSON.stringify(plain.choices[0])}`);

  // tool_choice "none": the call stays text, in each API's form of it
  const tcText = 'Sure!<tool_call>{"name":"get_weather","arguments":{"days":3}}</tool_call>';
  const nc = await openai.chat.completions.create({ model: 'm', messages, tools: [{ type: 'function', function: fn }],
    tool_choice: 'none', temperature: 0 });
  check(nc.choices[0].message.content === tcText && !nc.choices[0].message.tool_calls &&
    nc.choices[0].finish_reason === 'stop', `chat tool_choice none ${JSON.stringify(nc.choices[0])}`);
  const na = await anthropic.messages.create({ model: 'm', max_tokens: 100, messages, temperature: 0,
    tools: [{ name: fn.name, input_schema: fn.parameters }], tool_choice: { type: 'none' } });
  check(same(na.content.map(b => b.type), ['thinking', 'text']) && na.content[1].text === tcText &&
    na.stop_reason === 'end_turn', `messages tool_choice none ${JSON.stringify(na.content)}`);
  const nr = await openai.responses.create({ model: 'm', input: 'Weather?', temperature: 0, tool_choice: 'none',
    tools: [{ type: 'function', name: fn.name, parameters: fn.parameters, strict: false }] });
  check(nr.output_text === tcText && !nr.output.some(o => o.type === 'function_call'), `responses tool_choice none ${JSON.stringify(nr.output)}`);

  // cut off inside the call: nothing is lost, it comes back as text
  const cut = await openai.chat.completions.create({ model: 'm', messages, tools: [{ type: 'function', function: fn }],
    temperature: 0, max_tokens: 10 });
  check(cut.choices[0].message.content === 'Sure!<tool_call>{"name":"' && !cut.choices[0].message.tool_calls &&
    cut.choices[0].finish_reason === 'length', `chat cut-off call ${JSON.stringify(cut.choices[0])}`);

  // the call and its result go back in as history
  const turn2 = await openai.chat.completions.create({ model: 'm', temperature: 0, max_tokens: 2,
    tools: [{ type: 'function', function: fn }], messages: [...messages,
      { role: 'assistant', content: m.content, tool_calls: m.tool_calls },
      { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"forecast":"sun"}' }] });
  check(turn2.usage.prompt_tokens > c.usage.prompt_tokens + 20, `chat tool round trip ${JSON.stringify(turn2.usage)}`);

  // ---- Anthropic Messages ----
  const tool = { name: fn.name, description: fn.description, input_schema: fn.parameters };
  const a = await anthropic.messages.create({ model: 'm', max_tokens: 100, messages, tools: [tool],
    tool_choice: { type: 'auto' }, temperature: 0 });
  check(same(a.content.map(b => b.type), ['thinking', 'text', 'tool_use']), `messages blocks ${JSON.stringify(a.content)}`);
  check(a.content[0].thinking === 'Checking.' && a.content[1].text === 'Sure!', 'messages thinking and text');
  check(a.content[2].id.startsWith('toolu_') && a.content[2].name === 'get_weather' && same(a.content[2].input, args),
    `messages tool_use ${JSON.stringify(a.content[2])}`);
  check(a.stop_reason === 'tool_use', `messages stop_reason ${a.stop_reason}`);

  const as = anthropic.messages.stream({ model: 'm', max_tokens: 100, messages, tools: [tool], temperature: 0 });
  const af = await as.finalMessage();
  check(same(af.content.map(b => b.type), ['thinking', 'text', 'tool_use']) && af.content[0].thinking === 'Checking.' &&
    af.content[1].text === 'Sure!' && af.content[2].name === 'get_weather' && same(af.content[2].input, args) &&
    af.stop_reason === 'tool_use', `messages stream ${JSON.stringify(af)}`);

  const a2 = await anthropic.messages.create({ model: 'm', max_tokens: 2, tools: [tool], messages: [...messages,
    { role: 'assistant', content: a.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: a.content[2].id, content: 'sun' }] }] });
  check(a2.usage.input_tokens > a.usage.input_tokens + 20, `messages tool round trip ${JSON.stringify(a2.usage)}`);

  // ---- Responses ----
  const rtool = { type: 'function', name: fn.name, description: fn.description, parameters: fn.parameters, strict: false };
  const r = await openai.responses.create({ model: 'm', input: 'Weather for the next days?', tools: [rtool], temperature: 0 });
  check(same(r.output.map(o => o.type), ['reasoning', 'message', 'function_call']), `responses output ${JSON.stringify(r.output)}`);
  check(r.output[0].content?.[0]?.text === 'Checking.' && r.output_text === 'Sure!', `responses reasoning and text ${JSON.stringify(r.output)}`);
  const call = r.output[2];
  check(call.name === 'get_weather' && call.call_id.startsWith('call_') && call.status === 'completed' &&
    same(JSON.parse(call.arguments), args), `responses function_call ${JSON.stringify(call)}`);

  const rs = await openai.responses.create({ model: 'm', input: 'Weather for the next days?', tools: [rtool],
    temperature: 0, stream: true });
  let done = null, argsDone = null, rtext = '', rreason = '';
  for await (const e of rs) {
    if (e.type === 'response.completed') done = e.response;
    if (e.type === 'response.function_call_arguments.done') argsDone = e.arguments;
    if (e.type === 'response.output_text.delta') rtext += e.delta;
    if (e.type === 'response.reasoning_text.delta') rreason += e.delta;
  }
  check(done && same(done.output.map(o => o.type), ['reasoning', 'message', 'function_call']) &&
    done.output[2].name === 'get_weather' && rtext === 'Sure!' && rreason === 'Checking.' &&
    same(JSON.parse(argsDone), args), `responses stream ${JSON.stringify(done?.output)}`);

  // the stored turn and a function_call_output continue it
  const r2 = await openai.responses.create({ model: 'm', previous_response_id: r.id, max_output_tokens: 2,
    tools: [rtool], input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"forecast":"sun"}' }] });
  check(r2.usage.input_tokens > r.usage.input_tokens + 20, `responses tool round trip ${JSON.stringify(r2.usage)}`);

  // request bodies shaped like the coding agents' own: Claude Code's (system
  // blocks with cache_control, thinking, metadata, betas) and Codex's
  // (include, reasoning summary, store false, a built-in tool among the
  // functions, prompt_cache_key, text verbosity), streamed as they stream
  const cc1 = await anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 32000, temperature: 1,
    system: [{ type: 'text', text: 'You are a coding agent.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Weather?', cache_control: { type: 'ephemeral' } }] }],
    tools: [tool, { name: 'Bash', description: 'Run a command', input_schema: { type: 'object', properties: { command: { type: 'string' } },
      required: ['command'], additionalProperties: false, $schema: 'http://json-schema.org/draft-07/schema#' } }],
    tool_choice: { type: 'auto' }, thinking: { type: 'enabled', budget_tokens: 1024 }, metadata: { user_id: 'u' } },
    { headers: { 'anthropic-beta': 'interleaved-thinking-2025-05-14' } }).finalMessage();
  check(cc1.stop_reason === 'tool_use' && cc1.content.at(-1).name === 'get_weather', `a Claude Code shaped request ${JSON.stringify(cc1.content)}`);
  let cx = null;
  for await (const e of await openai.responses.create({ model: 'gpt-5-codex', instructions: 'You are a coding agent.',
    input: [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Weather?' }] }],
    tools: [rtool, { type: 'web_search' }], tool_choice: 'auto', parallel_tool_calls: false,
    reasoning: { effort: 'medium', summary: 'auto' }, store: false, stream: true,
    include: ['reasoning.encrypted_content'], prompt_cache_key: 'k', text: { verbosity: 'medium' } }))
    if (e.type === 'response.completed') cx = e.response;
  check(cx?.output.at(-1)?.type === 'function_call' && cx.output.at(-1).name === 'get_weather',
    `a Codex shaped request ${JSON.stringify(cx?.output)}`);

  // Codex's own tool kinds, offered to the template as functions: a custom
  // (freeform) tool's call comes back as a custom_tool_call (its input the
  // arguments' text, the fixture's call having no "input" string),
  // streamed with custom_tool_call_input events; what the request chose is
  // echoed
  const ctool = { type: 'custom', name: 'get_weather', description: 'The forecast',
    format: { type: 'grammar', syntax: 'lark', definition: 'start: /.+/' } };
  const creq = { model: 'gpt-5-codex', input: 'Weather?', tools: [ctool, { type: 'local_shell' }], temperature: 0,
    parallel_tool_calls: false, tool_choice: 'auto', reasoning: { effort: 'low' }, truncation: 'auto' };
  const rc = await openai.responses.create(creq);
  const cc0 = rc.output.at(-1);
  check(same(rc.output.map(o => o.type), ['reasoning', 'message', 'custom_tool_call']) && cc0.name === 'get_weather' &&
    cc0.call_id.startsWith('call_') && cc0.id.startsWith('ctc_') && cc0.status === 'completed' &&
    same(JSON.parse(cc0.input), args), `responses custom_tool_call ${JSON.stringify(rc.output)}`);
  check(rc.parallel_tool_calls === false && rc.tool_choice === 'auto' && rc.reasoning?.effort === 'low' &&
    rc.truncation === 'auto', `responses echo ${JSON.stringify([rc.parallel_tool_calls, rc.tool_choice, rc.reasoning, rc.truncation])}`);
  let cadded = null, cdelta = '', cdone = null, cfinal = null;
  for await (const e of await openai.responses.create({ ...creq, stream: true })) {
    if (e.type === 'response.output_item.added' && e.item.type === 'custom_tool_call') cadded = e.item;
    if (e.type === 'response.custom_tool_call_input.delta') cdelta += e.delta;
    if (e.type === 'response.custom_tool_call_input.done') cdone = e.input;
    if (e.type === 'response.completed') cfinal = e.response;
  }
  check(cadded?.status === 'in_progress' && cadded.input === '' && cdelta === cc0.input && cdone === cc0.input &&
    cfinal?.output.at(-1)?.type === 'custom_tool_call' && cfinal.output.at(-1).input === cc0.input,
    `responses custom_tool_call streamed ${JSON.stringify([cadded, cdelta, cdone, cfinal?.output])}`);
  // the stored turn and a custom_tool_call_output continue it
  const rc2 = await openai.responses.create({ model: 'm', previous_response_id: rc.id, max_output_tokens: 2,
    tools: creq.tools, input: [{ type: 'custom_tool_call_output', call_id: cc0.call_id, output: 'sun' }] });
  check(rc2.usage.input_tokens > rc.usage.input_tokens + 10, `responses custom round trip ${JSON.stringify([rc.usage, rc2.usage])}`);
  // their history items are the template's calls: the same prompt as the
  // function form of the same calls
  const hist = (items) => openai.responses.create({ model: 'm', max_output_tokens: 1,
    tools: [ctool, { type: 'local_shell' }], input: [{ role: 'user', content: 'Weather?' }, ...items] });
  const h1 = await hist([{ type: 'custom_tool_call', call_id: 'c1', name: 'get_weather', input: 'days=3' },
    { type: 'custom_tool_call_output', call_id: 'c1', output: 'sun' },
    { type: 'local_shell_call', id: 'lsc_1', call_id: 'c2', status: 'completed',
      action: { type: 'exec', command: ['ls', '-a'], working_directory: '/w', timeout_ms: 100, env: {} } },
    { type: 'local_shell_call_output', call_id: 'c2', output: [{ type: 'input_text', text: 'a.c' }] }]);
  const h2 = await hist([{ type: 'function_call', call_id: 'c1', name: 'get_weather', arguments: '{"input":"days=3"}' },
    { type: 'function_call_output', call_id: 'c1', output: 'sun' },
    { type: 'function_call', call_id: 'c2', name: 'local_shell', arguments: '{"command":["ls","-a"],"workdir":"/w","timeout_ms":100}' },
    { type: 'function_call_output', call_id: 'c2', output: 'a.c' }]);
  const h0 = await hist([]);
  check(h1.usage.input_tokens === h2.usage.input_tokens && h1.usage.input_tokens > h0.usage.input_tokens + 30,
    `custom and local_shell history: ${h1.usage.input_tokens} / function form ${h2.usage.input_tokens} / none ${h0.usage.input_tokens}`);

  // two calls of one answer and their results: the same prompt from all three
  // APIs (arguments as this server returns them, which is how the template
  // writes an object's)
  const two = [{ id: 'call_a', days: 1 }, { id: 'call_b', days: 2 }];
  const cc = await openai.chat.completions.create({ model: 'm', max_tokens: 1, tools: [{ type: 'function', function: fn }],
    messages: [...messages, { role: 'assistant', content: null, tool_calls: two.map(t => ({ id: t.id, type: 'function',
      function: { name: 'get_weather', arguments: `{"days": ${t.days}}` } })) },
    ...two.map(t => ({ role: 'tool', tool_call_id: t.id, content: `sun ${t.days}` }))] });
  const ca = await anthropic.messages.create({ model: 'm', max_tokens: 1, tools: [tool], messages: [...messages,
    { role: 'assistant', content: two.map(t => ({ type: 'tool_use', id: t.id, name: 'get_weather', input: { days: t.days } })) },
    { role: 'user', content: two.map(t => ({ type: 'tool_result', tool_use_id: t.id, content: `sun ${t.days}` })) }] });
  const cr = await openai.responses.create({ model: 'm', max_output_tokens: 1, tools: [rtool], input: [
    { role: 'user', content: messages[0].content },
    ...two.map(t => ({ type: 'function_call', call_id: t.id, name: 'get_weather', arguments: `{"days": ${t.days}}` })),
    ...two.map(t => ({ type: 'function_call_output', call_id: t.id, output: `sun ${t.days}` }))] });
  check(cc.usage.prompt_tokens === ca.usage.input_tokens && ca.usage.input_tokens === cr.usage.input_tokens,
    `two calls: chat ${cc.usage.prompt_tokens}, messages ${ca.usage.input_tokens}, responses ${cr.usage.input_tokens} prompt tokens`);
} catch (e) {
  fail++;
  console.error(`FAIL [tools]: ${e.stack || e}`);
}
console.log(`tools: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
