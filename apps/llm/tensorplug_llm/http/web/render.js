// A reply's markdown as HTML. The model's text is untrusted: marked's HTML goes through
// DOMPurify before it reaches the page, so no script or event handler in it runs.
// Vendored (vendor/README.md): marked 18.2.1 (MIT), DOMPurify 3.5.0 (MPL-2.0 or Apache-2.0).
import { marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.js";

export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: true }));
}
