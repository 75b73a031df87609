// sdk.mjs - the official OpenAI and Anthropic SDKs, unmodified, against a
// running cllm serve: chat (non-stream + stream), completions, Responses,
// Messages (non-stream + stream) and SDK-raised errors.
//
//   node sdk.mjs <base url, e.g. http://127.0.0.1:8080> <label>
//
// Prints one line per check; exits 1 when any check failed.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

const [base, label = 'sdk'] = process.argv.slice(2);
let pass = 0, fail = 0;
const check = (cond, what) => {
  if (cond) pass++;
  else { fail++; console.error(`FAIL [${label}]: ${what}`); }
};
const isUsage = (u, pt) =>
  u && Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0 && Number.isInteger(u.completion_tokens) &&
  u.total_tokens === u.prompt_tokens + u.completion_tokens && (pt === undefined || u.prompt_tokens === pt);

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'system', content: 'You tell short stories.' }, { role: 'user', content: 'Once upon a time' }];

try {
  // chat, non-stream: max_tokens -> finish_reason "length" with exact usage
  const c = await openai.chat.completions.create({ model: 'anything', messages, max_tokens: 8, temperature: 0 });
  check(c.object === 'chat.completion' && c.choices.length === 1, 'chat object');
  check(typeof c.choices[0].message.content === 'string' && c.choices[0].message.role === 'assistant', 'chat message');
  check(c.choices[0].finish_reason === 'length' || c.choices[0].finish_reason === 'stop', `chat finish ${c.choices[0].finish_reason}`);
  check(isUsage(c.usage) && (c.choices[0].finish_reason !== 'length' || c.usage.completion_tokens === 8), `chat usage ${JSON.stringify(c.usage)}`);
  check(Number.isInteger(c.usage.prompt_tokens_details?.cached_tokens) &&
    c.usage.prompt_tokens_details.cached_tokens < c.usage.prompt_tokens, 'cached_tokens');
  check(c.model === 'anything', 'model name echoed');

  // chat, stream with usage: same text as non-stream under greedy decoding
  const s = await openai.chat.completions.create({ model: 'anything', messages, max_tokens: 8, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const ch of s) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) {
      text += choice.delta?.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check(chunks >= 3, 'chat stream chunks');
  check(text === c.choices[0].message.content, `chat stream text "${text}" vs "${c.choices[0].message.content}"`);
  check(finish === c.choices[0].finish_reason, 'chat stream finish_reason');
  check(isUsage(usage, c.usage.prompt_tokens) && usage.completion_tokens === c.usage.completion_tokens, 'chat stream usage');

  // logprobs through the SDK's types: one entry a token, the text they spell
  const lp = await openai.chat.completions.create({ model: 'anything', messages, max_tokens: 6, temperature: 0,
    logprobs: true, top_logprobs: 2, presence_penalty: 0.5, logit_bias: { '5': -1 } });
  const entries = lp.choices[0].logprobs?.content ?? [];
  check(entries.length === lp.usage.completion_tokens && entries.every((e) => e.top_logprobs.length === 2 &&
    e.logprob <= 0 && Array.isArray(e.bytes)), `chat logprobs ${JSON.stringify(lp.choices[0].logprobs)}`);
  if (!lp.choices[0].message.reasoning_content && !lp.choices[0].message.tool_calls) // markup is not text
    check(entries.map((e) => e.token).join('') === (lp.choices[0].message.content ?? ''), 'chat logprobs spell the text');

  // legacy completions, non-stream + stream
  const p = await openai.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
  check(p.object === 'text_completion' && typeof p.choices[0].text === 'string' && isUsage(p.usage), 'completions');
  let ptext = '';
  for await (const ch of await openai.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 6,
    temperature: 0, stream: true }))
    ptext += ch.choices[0]?.text ?? '';
  check(ptext === p.choices[0].text, `completions stream "${ptext}" vs "${p.choices[0].text}"`);

  // Responses: non-stream, previous_response_id, stream
  const r1 = await openai.responses.create({ model: 'x', input: 'Once upon a time', instructions: 'Tell a story.',
    max_output_tokens: 6, temperature: 0 });
  check(r1.object === 'response' && typeof r1.output_text === 'string' && r1.usage?.output_tokens > 0, 'responses');
  const r2 = await openai.responses.create({ model: 'x', input: 'And then?', previous_response_id: r1.id,
    max_output_tokens: 4, temperature: 0 });
  check(r2.usage.input_tokens > r1.usage.input_tokens, 'previous_response_id carries the conversation');
  const types = [];
  let rtext = '';
  for await (const ev of await openai.responses.create({ model: 'x', input: 'Once upon a time',
    instructions: 'Tell a story.', max_output_tokens: 6, temperature: 0, stream: true })) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') rtext += ev.delta;
  }
  check(types[0] === 'response.created' && /response\.(completed|incomplete)/.test(types.at(-1)), `responses stream ${types}`);
  check(rtext === r1.output_text, `responses stream text "${rtext}" vs "${r1.output_text}"`);

  // Anthropic messages, non-stream
  const m = await anthropic.messages.create({ model: 'claude-anything', max_tokens: 8, temperature: 0,
    system: 'You tell short stories.', messages: [{ role: 'user', content: 'Once upon a time' }] });
  check(m.type === 'message' && m.role === 'assistant' && m.content[0]?.type === 'text', 'messages object');
  check(['end_turn', 'max_tokens', 'stop_sequence'].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  check(m.usage.input_tokens === c.usage.prompt_tokens && m.usage.output_tokens > 0, `messages usage ${JSON.stringify(m.usage)}`);
  check(m.content[0].text === c.choices[0].message.content, 'messages text = chat text (same prompt, greedy)');

  // Anthropic messages, stream: the helper assembles the same message
  const stream = anthropic.messages.stream({ model: 'claude-anything', max_tokens: 8, temperature: 0,
    system: 'You tell short stories.', messages: [{ role: 'user', content: 'Once upon a time' }] });
  const evs = [];
  stream.on('streamEvent', (e) => evs.push(e.type));
  const fm = await stream.finalMessage();
  check(fm.content[0]?.text === m.content[0].text, `messages stream text "${fm.content[0]?.text}"`);
  check(fm.usage.output_tokens === m.usage.output_tokens && fm.stop_reason === m.stop_reason, 'messages stream usage/stop');
  check(evs[0] === 'message_start' && evs.at(-1) === 'message_stop' && evs.includes('content_block_delta'),
    `messages stream events ${evs}`);

  // errors come back as the SDKs' typed errors
  try {
    await openai.chat.completions.create({ model: 'x', messages, temperature: 'hot' });
    check(false, 'openai 400 not raised');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.param === 'temperature', `openai error ${e}`);
  }
  try {
    await anthropic.messages.create({ model: 'x', max_tokens: 4, messages: [{ role: 'robot', content: 'hi' }] });
    check(false, 'anthropic 400 not raised');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error', `anthropic error ${e}`);
  }
} catch (e) {
  check(false, `unexpected: ${e?.stack ?? e}`);
}
console.log(`sdk [${label}]: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
