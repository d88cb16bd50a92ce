// The official OpenAI JavaScript client against http_svc: streams a completion (and a chat
// completion when asked) and prints what it got as one JSON line for openai_js_test.sh to compare.
import OpenAI from "openai";

const [baseURL, prompt, maxTokens, chatText] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });
const out = {};

const stream = await client.completions.create({
  model: "fortune-q8_0", prompt, max_tokens: Number(maxTokens), stream: true,
  stream_options: { include_usage: true },
});
out.completion = "";
for await (const chunk of stream) {
  if (chunk.choices.length) out.completion += chunk.choices[0].text;
  if (chunk.usage) out.completion_usage = chunk.usage;
}
if (chatText) {
  const chat = await client.chat.completions.create({
    model: "fortune-q8_0", messages: [{ role: "user", content: chatText }], chat_template: "chatml",
    max_tokens: Number(maxTokens), stream: true,
  });
  out.chat = "";
  for await (const chunk of chat) if (chunk.choices.length) out.chat += chunk.choices[0].delta.content ?? "";
}
console.log(JSON.stringify(out));
