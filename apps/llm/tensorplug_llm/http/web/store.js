// What the page keeps in the browser's localStorage: the conversations, the sampling
// settings and the API key. Nothing is kept on the server.

const CONVERSATIONS = "tensorplug.conversations";
const SETTINGS = "tensorplug.settings";
const API_KEY = "tensorplug.apiKey";

function read(name, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(name));
    return value ?? fallback;
  } catch {
    return fallback; // an entry another version wrote, or edited by hand: start afresh
  }
}

/** The conversations, the last changed first: {id, title, messages, tokens}. */
export function loadConversations() {
  const list = read(CONVERSATIONS, []);
  return Array.isArray(list) ? list : [];
}

export function saveConversations(list) {
  localStorage.setItem(CONVERSATIONS, JSON.stringify(list));
}

export function newConversation() {
  return { id: crypto.randomUUID(), title: "New conversation", messages: [], tokens: 0 };
}

/** The sampling settings the user set; a field left empty is the server's default. */
export function loadSettings() {
  return read(SETTINGS, {});
}

export function saveSettings(settings) {
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}

export function loadKey() {
  return localStorage.getItem(API_KEY) ?? "";
}

export function saveKey(key) {
  localStorage.setItem(API_KEY, key);
}
