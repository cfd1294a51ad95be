// The server's API as the page calls it: the model's name, its context size, and a chat
// streamed as OpenAI's server-sent events. Paths are relative, so the page also works
// behind a proxy that serves it under a prefix.

/** The server refused the API key (401): the page asks for another. */
export class AuthError extends Error {}

/** Any other error the server answered, with its message. */
export class ApiError extends Error {}

function headers(key) {
  const h = { "Content-Type": "application/json" };
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function checked(response) {
  if (response.ok) return response;
  let message = `${response.status} ${response.statusText}`;
  try {
    message = (await response.json()).error?.message ?? message;
  } catch {
    // not OpenAI's error shape: the status line says enough
  }
  throw response.status === 401 ? new AuthError(message) : new ApiError(message);
}

/** The served model's name (a public route: no key needed). */
export async function modelName() {
  const response = await checked(await fetch("v1/models"));
  return (await response.json()).data[0].id;
}

/** The context size in tokens, from /props (needs the key when the server has one). */
export async function contextSize(key) {
  const response = await checked(await fetch("props", { headers: headers(key) }));
  return (await response.json()).default_generation_settings.n_ctx;
}

/** Each chunk of a streamed chat; aborting `signal` stops it (and the server's work). */
export async function* streamChat(body, key, signal) {
  const request = { method: "POST", headers: headers(key), body: JSON.stringify(body), signal };
  const response = await checked(await fetch("v1/chat/completions", request));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(chunk.error.message); // e.g. the timeout, mid-stream
      yield chunk;
    }
  }
}
