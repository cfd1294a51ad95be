// The chat page: conversations in the sidebar, the current one's messages, a reply
// streamed into its bubble as it comes, Stop, Regenerate, the sampling settings and the
// API key. State lives in localStorage (store.js); the server is reached through api.js.
import { AuthError, contextSize, modelName, streamChat } from "./api.js";
import { renderMarkdown } from "./render.js";
import * as store from "./store.js";

const $ = (id) => document.getElementById(id);
const NUMBERS = ["temperature", "top_p", "top_k", "min_p", "max_tokens"];

let conversations = store.loadConversations();
let current = conversations[0] ?? null;
let nCtx = null; // the model's context, once /props answered
let running = null; // the AbortController of the reply being streamed

function save() {
  store.saveConversations(conversations);
}

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

// ---- the sidebar

function showList() {
  const list = $("conversations");
  list.replaceChildren(
    ...conversations.map((c) => {
      const item = document.createElement("li");
      item.dataset.id = c.id;
      item.classList.toggle("current", c === current);
      const open = document.createElement("button");
      open.className = "open";
      open.type = "button";
      open.textContent = c.title;
      open.onclick = () => select(c);
      const remove = document.createElement("button");
      remove.className = "delete";
      remove.type = "button";
      remove.textContent = "×";
      remove.title = `Delete "${c.title}"`;
      remove.setAttribute("aria-label", remove.title);
      remove.onclick = () => deleteConversation(c);
      item.append(open, remove);
      return item;
    }),
  );
}

function select(conversation) {
  if (running) return; // a reply being streamed belongs to the shown conversation
  current = conversation;
  showAll();
}

function deleteConversation(conversation) {
  if (running && conversation === current) return;
  conversations = conversations.filter((c) => c !== conversation);
  if (current === conversation) current = conversations[0] ?? null;
  save();
  showAll();
}

// ---- the messages

function fill(bubble, message) {
  const content = bubble.querySelector(".content");
  if (message.role === "assistant") content.innerHTML = renderMarkdown(message.content);
  else content.textContent = message.content; // the user's text is shown as typed
  const note = bubble.querySelector(".note");
  note.textContent = message.error ? `Error: ${message.error}` : message.stopped ? "stopped" : "";
  note.classList.toggle("error", Boolean(message.error));
}

function bubbleFor(message) {
  const bubble = document.createElement("div");
  bubble.className = `message ${message.role}`;
  const content = document.createElement("div");
  content.className = "content";
  const note = document.createElement("div");
  note.className = "note";
  bubble.append(content, note);
  fill(bubble, message);
  return bubble;
}

function showMessages() {
  const messages = current?.messages ?? [];
  $("messages").replaceChildren(...messages.map(bubbleFor));
  $("messages").scrollTop = $("messages").scrollHeight;
}

function showContext() {
  const used = current?.tokens ?? 0;
  $("context").textContent = nCtx === null ? "" : `context: ${used} / ${nCtx} tokens`;
}

function showButtons() {
  $("send").disabled = running !== null;
  $("stop").disabled = running === null;
  const canRegenerate = current?.messages.some((m) => m.role === "user") ?? false;
  $("regenerate").disabled = running !== null || !canRegenerate;
}

function showAll() {
  showList();
  showMessages();
  showContext();
  showButtons();
}

// ---- settings

function readSettings() {
  const settings = {};
  for (const name of NUMBERS) {
    const value = $(name).value.trim();
    if (value !== "") settings[name] = Number(value);
  }
  settings.system_prompt = $("system_prompt").value;
  return settings;
}

function showSettings() {
  const settings = store.loadSettings();
  for (const name of [...NUMBERS, "system_prompt"]) $(name).value = settings[name] ?? "";
}

// ---- a reply

function requestBody(conversation) {
  const { system_prompt: system, ...sampling } = readSettings();
  const history = conversation.messages
    .filter((m) => !(m.role === "assistant" && m.error && !m.content))
    .map(({ role, content }) => ({ role, content }));
  const messages = system ? [{ role: "system", content: system }, ...history] : history;
  return { messages, stream: true, stream_options: { include_usage: true }, ...sampling };
}

async function reply(conversation) {
  const body = requestBody(conversation);
  const message = { role: "assistant", content: "" };
  conversation.messages.push(message);
  const bubble = bubbleFor(message);
  bubble.classList.add("streaming");
  $("messages").append(bubble);
  running = new AbortController();
  showButtons();
  status("");
  try {
    for await (const chunk of streamChat(body, store.loadKey(), running.signal)) {
      const piece = chunk.choices?.[0]?.delta?.content;
      if (piece) {
        message.content += piece;
        fill(bubble, message);
        $("messages").scrollTop = $("messages").scrollHeight;
      }
      if (chunk.usage) {
        conversation.tokens = chunk.usage.total_tokens;
        showContext();
      }
    }
  } catch (error) {
    if (error.name === "AbortError") message.stopped = true;
    else message.error = error.message;
    if (error instanceof AuthError) askKey(error.message);
  } finally {
    running = null;
    bubble.classList.remove("streaming");
    fill(bubble, message);
    save();
    showButtons();
  }
}

function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || running) return;
  if (!current) {
    current = store.newConversation();
    conversations.unshift(current);
  }
  if (current.messages.length === 0) current.title = text.slice(0, 40);
  current.messages.push({ role: "user", content: text });
  conversations = [current, ...conversations.filter((c) => c !== current)];
  $("prompt").value = "";
  save();
  showAll();
  reply(current);
}

function regenerate() {
  if (running || !current) return;
  const messages = current.messages;
  while (messages.length && messages.at(-1).role === "assistant") messages.pop();
  save();
  showMessages();
  reply(current);
}

// ---- the key

function askKey(reason) {
  $("key-error").textContent = reason ?? "";
  $("api-key").value = store.loadKey();
  if (!$("key-dialog").open) $("key-dialog").showModal();
}

async function connect() {
  try {
    nCtx = await contextSize(store.loadKey());
    if ($("key-dialog").open) $("key-dialog").close();
    showContext();
  } catch (error) {
    if (error instanceof AuthError) askKey(store.loadKey() ? "The server refused this key." : "");
    else status(`Cannot read the server's properties: ${error.message}`, true);
  }
}

// ---- start

$("composer").addEventListener("submit", send);
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) send(event);
});
$("stop").addEventListener("click", () => running?.abort());
$("regenerate").addEventListener("click", regenerate);
$("new-chat").addEventListener("click", () => {
  if (running) return;
  current = store.newConversation();
  conversations.unshift(current);
  save();
  showAll();
  $("prompt").focus();
});
$("settings-form").addEventListener("input", () => store.saveSettings(readSettings()));
$("key-button").addEventListener("click", () => askKey(""));
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  store.saveKey($("api-key").value.trim());
  connect();
});

showSettings();
showAll();
modelName().then(
  (name) => ($("model").textContent = name),
  (error) => status(`Cannot reach the server: ${error.message}`, true),
);
connect();
