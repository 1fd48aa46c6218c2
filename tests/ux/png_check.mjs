// Is a screenshot blank? Decodes a PNG (8-bit RGB or RGBA, not interlaced: what headless
// Chromium writes) with Node's own zlib, and counts the pixels that differ from the most
// common colour (the background) and the distinct colours. Prints them as one JSON line;
// exits 1 when the picture is blank (under min_fraction of the pixels differ from the
// background, or under 8 colours), 2 when the file is not such a PNG.
//
// usage: node png_check.mjs FILE [min_fraction (default 0.02)]
import { readFileSync } from "node:fs";
import { inflateSync } from "node:zlib";

const [file, minArg] = process.argv.slice(2);
const minFraction = minArg ? Number(minArg) : 0.02;
const fail = (code, msg) => {
  console.error(`png_check: ${file}: ${msg}`);
  process.exit(code);
};

const buf = readFileSync(file);
if (buf.length < 8 || buf.readUInt32BE(0) !== 0x89504e47) fail(2, "not a PNG");
let width = 0, height = 0, depth = 0, type = 0, interlace = 0;
const idat = [];
for (let at = 8; at + 8 <= buf.length;) {
  const len = buf.readUInt32BE(at), kind = buf.toString("ascii", at + 4, at + 8);
  const data = buf.subarray(at + 8, at + 8 + len);
  if (kind === "IHDR") {
    width = data.readUInt32BE(0);
    height = data.readUInt32BE(4);
    depth = data[8];
    type = data[9];
    interlace = data[12];
  } else if (kind === "IDAT") {
    idat.push(data);
  } else if (kind === "IEND") {
    break;
  }
  at += 12 + len;
}
if (depth !== 8 || (type !== 2 && type !== 6) || interlace !== 0)
  fail(2, `unsupported PNG (depth ${depth}, colour type ${type}, interlace ${interlace})`);
const bpp = type === 6 ? 4 : 3, stride = width * bpp;
const raw = inflateSync(Buffer.concat(idat));
if (raw.length < height * (stride + 1)) fail(2, "truncated image data");

// Undo the per-row filters (PNG spec, section 9).
const px = Buffer.alloc(height * stride);
for (let y = 0; y < height; y++) {
  const f = raw[y * (stride + 1)], src = y * (stride + 1) + 1, dst = y * stride;
  for (let x = 0; x < stride; x++) {
    const a = x >= bpp ? px[dst + x - bpp] : 0, b = y > 0 ? px[dst - stride + x] : 0;
    const c = x >= bpp && y > 0 ? px[dst - stride + x - bpp] : 0;
    let v = raw[src + x];
    if (f === 1) v += a;
    else if (f === 2) v += b;
    else if (f === 3) v += (a + b) >> 1;
    else if (f === 4) {
      const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
      v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
    }
    px[dst + x] = v & 255;
  }
}

const counts = new Map();
for (let i = 0; i < px.length; i += bpp) {
  const key = (px[i] << 16) | (px[i + 1] << 8) | px[i + 2];
  counts.set(key, (counts.get(key) || 0) + 1);
}
let background = 0, most = 0;
for (const [k, n] of counts) if (n > most) (most = n), (background = k);
const total = width * height, fraction = (total - most) / total;
const stats = {
  width, height, colours: counts.size, background: "#" + background.toString(16).padStart(6, "0"),
  non_background_fraction: Number(fraction.toFixed(4)),
};
console.log(JSON.stringify(stats));
if (fraction < minFraction || counts.size < 8) fail(1, `blank: ${JSON.stringify(stats)}`);
