// docs/app.png: the real page after its "generate" button, through the Chrome DevTools Protocol (Node 20+, no packages).
//   python -m vit5_sit.app --port 7871 &                     # the page, the bundled demo at its defaults
//   chromium --headless --no-sandbox --disable-gpu --disable-background-networking --remote-debugging-port=9333 &
//   node --experimental-websocket docs/app_screenshot.mjs 9333 http://127.0.0.1:7871/ docs/app.png 960 1320
// (Debian: apt-get install -y chromium; --experimental-websocket is not needed from Node 22.)
import { writeFileSync } from "node:fs";
const [port, url, out, width, height] = process.argv.slice(2);
const targets = await (await fetch(`http://127.0.0.1:${port}/json`)).json();
const ws = new WebSocket(targets.find(t => t.type === "page").webSocketDebuggerUrl);
await new Promise(r => ws.addEventListener("open", r));
let id = 0; const waiting = new Map();
ws.addEventListener("message", e => { const m = JSON.parse(e.data); if (waiting.has(m.id)) { waiting.get(m.id)(m); waiting.delete(m.id); } });
const send = (method, params = {}) => new Promise(r => { waiting.set(++id, r); ws.send(JSON.stringify({ id, method, params })); });
const sleep = ms => new Promise(r => setTimeout(r, ms));
const js = async expr => (await send("Runtime.evaluate", { expression: expr, returnByValue: true })).result?.result?.value;
await send("Emulation.setDeviceMetricsOverride", { width: +width, height: +height, deviceScaleFactor: 1, mobile: false });
await send("Page.enable");
await send("Page.navigate", { url });
for (let i = 0; i < 120 && !(await js(`[...document.querySelectorAll("button")].some(b => b.innerText.trim() === "generate")`)); i++) await sleep(500);
await sleep(1000);
await js(`[...document.querySelectorAll("button")].find(b => b.innerText.trim() === "generate").click()`);
const done = `document.body.innerText.includes("seeds 0-39:")`;
for (let i = 0; i < 600 && !(await js(done)); i++) await sleep(1000);
await sleep(2000);  // the image and the download box settle
const shot = await send("Page.captureScreenshot", { format: "png" });
writeFileSync(out, Buffer.from(shot.result.data, "base64"));
console.log(await js(`[...document.querySelectorAll("p")].map(p => p.innerText).filter(t => t.includes("seeds 0-39")).join(" ")`));
ws.close();
