// The chat page of `adarag serve`: streams answers from /v1/chat/completions, keeps the
// conversation, shows each answer's sources, TTFT and cache tiers, and adds documents through
// /v1/files. Every text from the server is set as text, never parsed as HTML.
"use strict";

const KEY_ITEM = "adarag-api-key";
const conversation = [];
let modelId = "adarag";
let streaming = null; // the AbortController of the answer streaming in, if any

const $ = (id) => document.getElementById(id);

function headers(extra = {}) {
  const key = sessionStorage.getItem(KEY_ITEM);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

function setStatus(text) {
  $("status").textContent = text;
}

async function errorText(response) {
  try {
    const body = await response.json();
    return body.error ? body.error.message : `HTTP ${response.status}`;
  } catch (err) {
    return `HTTP ${response.status}`;
  }
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function sourceLabel(source) {
  const meta = source.metadata || {};
  const parts = [meta.source || source.chunk_id];
  if (meta.page !== undefined) parts.push(`page ${meta.page}`);
  if (meta.row !== undefined) parts.push(`row ${meta.row}`);
  if (meta.title) parts.push(`"${meta.title}"`);
  if (meta.heading) parts.push(`§ ${meta.heading}`);
  const score = typeof source.score === "number" ? `[${source.score.toFixed(2)}] ` : "";
  return score + parts.join(", ");
}

function tierText(tiers) {
  const counts = {};
  for (const tier of tiers || []) counts[tier] = (counts[tier] || 0) + 1;
  const text = Object.entries(counts).map(([tier, n]) => `${tier} ×${n}`).join(", ");
  return text || "-";
}

function showFigures(bubble, figures) {
  const parts = [];
  if (figures.clientTtft !== undefined) parts.push(`first token after ${figures.clientTtft} s`);
  if (figures.serverTtft !== undefined) parts.push(`server TTFT ${figures.serverTtft} s`);
  if (figures.tiers !== undefined) parts.push(`cache tiers: ${figures.tiers}`);
  if (figures.cached !== undefined) parts.push(`${figures.cached} prompt tokens from cache`);
  if (figures.stopped) parts.push("stopped");
  bubble.querySelector(".meta").textContent = parts.join(" | ");
}

function sourceDetails(source) {
  // what the stream says of a source: its text when the server sends it, else where it is from
  const details = element("details", "");
  details.append(element("summary", "", sourceLabel(source)));
  if (typeof source.text === "string") details.append(element("div", "source-text", source.text));
  const fields = element("dl", "");
  const rows = { ...(source.metadata || {}), chunk_id: source.chunk_id, score: source.score };
  for (const [name, value] of Object.entries(rows)) {
    if (value === undefined || value === null || value === "") continue;
    fields.append(element("dt", "", name), element("dd", "", String(value)));
  }
  details.append(fields);
  const item = element("li", "source");
  item.append(details);
  return item;
}

function showSources(bubble, sources) {
  bubble.querySelector(".sources").replaceChildren(...sources.map(sourceDetails));
}

function showFailure(bubble, message) {
  bubble.classList.add("error");
  bubble.querySelector(".meta").textContent = "";
  bubble.querySelector(".failure").textContent = message;
  bubble.dataset.failed = "true";
}

async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

// Asks the question with the conversation so far; the turn joins the conversation once it is
// answered (or stopped, with what arrived by then), never when the request failed.
async function ask(question, controller) {
  $("conversation").append(element("div", "message user", question));
  const bubble = element("div", "message assistant");
  bubble.append(element("div", "text", ""), element("div", "failure", ""));
  bubble.append(element("div", "meta", "..."), element("ol", "sources"));
  bubble.dataset.deltas = "0";
  $("conversation").append(bubble);
  const figures = {};
  const started = performance.now();
  let answer = "";
  try {
    await streamAnswer(question, controller.signal, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.adarag) {
        showSources(bubble, chunk.adarag.sources || []);
        if (chunk.adarag.stop_reason !== "no_context") {
          figures.serverTtft = chunk.adarag.ttft_s.toFixed(2);
          figures.tiers = tierText(chunk.adarag.tiers);
        }
      }
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (figures.clientTtft === undefined) {
          figures.clientTtft = ((performance.now() - started) / 1000).toFixed(2);
        }
        answer += delta.content;
        bubble.querySelector(".text").textContent = answer;
        bubble.dataset.deltas = String(Number(bubble.dataset.deltas) + 1);
      }
      if (chunk.usage && chunk.usage.prompt_tokens_details) {
        figures.cached = chunk.usage.prompt_tokens_details.cached_tokens;
      }
      showFigures(bubble, figures);
    });
  } catch (err) {
    if (!controller.signal.aborted) {
      showFailure(bubble, String(err.message || err));
      return;
    }
    figures.stopped = true;
    bubble.dataset.stopped = "true";
    showFigures(bubble, figures);
  }
  if (answer) {
    conversation.push({ role: "user", content: question }, { role: "assistant", content: answer });
  }
  bubble.dataset.done = "true";
}

async function streamAnswer(question, signal, onEvent) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({
      model: modelId,
      messages: [...conversation, { role: "user", content: question }],
      stream: true,
      stream_options: { include_usage: true },
    }),
    signal,
  });
  if (!response.ok) throw new Error(await errorText(response));
  await readEvents(response, onEvent);
}

async function loadModel() {
  const response = await fetch("/v1/models", { headers: headers() });
  if (!response.ok) {
    setStatus(`${await errorText(response)}`);
    return false;
  }
  const body = await response.json();
  modelId = body.data[0].id;
  $("model").textContent = modelId;
  setStatus("");
  return true;
}

async function loadDocuments() {
  const response = await fetch("/v1/files", { headers: headers() });
  if (!response.ok) return [];
  const body = await response.json();
  const items = body.data.map((file) => {
    const item = element("li", "document");
    item.dataset.fileId = file.id;
    item.dataset.state = file.adarag ? file.adarag.state : file.status;
    const count = file.adarag ? file.adarag.num_chunks : undefined;
    const chunks = count === undefined ? "" : `${count} chunk${count === 1 ? "" : "s"}, `;
    item.append(element("span", "", `${file.filename} (${chunks}${item.dataset.state})`));
    const remove = element("button", "", "delete");
    remove.type = "button";
    remove.addEventListener("click", () => removeDocument(file.id, file.filename));
    item.append(remove);
    return item;
  });
  $("documents").replaceChildren(...items);
  return body.data;
}

async function removeDocument(fileId, filename) {
  if (!window.confirm(`Delete ${filename} from the knowledge base?`)) return;
  const response = await fetch(`/v1/files/${encodeURIComponent(fileId)}`, {
    method: "DELETE",
    headers: headers(),
  });
  setStatus(response.ok ? `deleted ${filename}` : await errorText(response));
  await loadDocuments();
}

async function upload(file) {
  const form = new FormData();
  form.append("purpose", "assistants");
  form.append("file", file, file.name);
  const response = await fetch("/v1/files", { method: "POST", headers: headers(), body: form });
  if (!response.ok) throw new Error(await errorText(response));
  let sent = await response.json();
  setStatus(`${sent.filename}: ${sent.adarag.state}`);
  while (sent.status === "uploaded") {
    await new Promise((resolve) => setTimeout(resolve, 500));
    const polled = await fetch(`/v1/files/${encodeURIComponent(sent.id)}`, { headers: headers() });
    if (!polled.ok) throw new Error(await errorText(polled));
    sent = await polled.json();
    setStatus(`${sent.filename}: ${sent.adarag.state}`);
    await loadDocuments();
  }
  if (sent.status === "error") throw new Error(`${sent.filename}: ${sent.status_details}`);
  const count = sent.adarag.num_chunks;
  setStatus(`${sent.filename} is ready (${count} chunk${count === 1 ? "" : "s"})`);
  await loadDocuments();
}

function busy(form, isBusy) {
  for (const control of form.querySelectorAll("button, textarea, input")) {
    control.disabled = control.id === "stop" ? !isBusy : isBusy;
  }
}

function start() {
  $("api-key").value = sessionStorage.getItem(KEY_ITEM) || "";
  $("key-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_ITEM, $("api-key").value.trim());
    if (await loadModel()) await loadDocuments();
  });
  $("ask-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const question = $("question").value.trim();
    if (!question || streaming) return;
    $("question").value = "";
    busy(event.target, true);
    streaming = new AbortController();
    try {
      await ask(question, streaming);
    } finally {
      streaming = null;
      busy(event.target, false);
      $("question").focus();
    }
  });
  $("question").addEventListener("keydown", (event) => {
    // Enter sends, Shift+Enter starts a new line (and Enter while composing text is the IME's)
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    $("ask-form").requestSubmit();
  });
  $("stop").addEventListener("click", () => streaming && streaming.abort());
  $("upload-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const file = $("upload").files[0];
    if (!file) return;
    busy(event.target, true);
    try {
      await upload(file);
    } catch (err) {
      setStatus(String(err.message || err));
    } finally {
      busy(event.target, false);
      $("upload").value = "";
    }
  });
  loadModel().then((ok) => ok && loadDocuments());
}

start();
