// The Grad-CAM overlay's pixels: an RGB image blended with a colormapped uint8 CAM, into a canvas.
import { lut } from "../lib/colormap";

/** Blend an RGB image (H×W×3) with a colormapped uint8 CAM (H×W) into RGBA `out`. */
export function blend(image: Uint8Array | null, cam: Uint8Array, cmap: string, alpha: number, out: Uint8ClampedArray): void {
  const table = lut(cmap);
  const a = Math.min(1, Math.max(0, alpha));
  const b = 1 - a;
  for (let i = 0, j = 0, k = 0; i < cam.length; i++, j += 4, k += 3) {
    const t = cam[i] * 4;
    const r = image ? image[k] : 0;
    const g = image ? image[k + 1] : 0;
    const bl = image ? image[k + 2] : 0;
    out[j] = b * r + a * table[t];
    out[j + 1] = b * g + a * table[t + 1];
    out[j + 2] = b * bl + a * table[t + 2];
    out[j + 3] = 255;
  }
}

/** Draw `cam` (H×W uint8) over `image` into `canvas` (resized to H×W; CSS size `maxW`×`maxH` at most). */
export function paint(canvas: HTMLCanvasElement, image: Uint8Array | null, cam: Uint8Array, width: number, height: number,
                      cmap: string, alpha: number, maxW: number, maxH: number): void {
  if (canvas.width !== width || canvas.height !== height) {
    canvas.width = width;
    canvas.height = height;
    // Small inputs are scaled up, large ones down.
    const s = Math.min(maxW / width, maxH / height);
    canvas.style.width = `${Math.round(width * s)}px`;
    canvas.style.height = `${Math.round(height * s)}px`;
  }
  const ctx = canvas.getContext("2d");
  if (!ctx) return;
  const img = ctx.createImageData(width, height);
  blend(image, cam, cmap, alpha, img.data);
  ctx.putImageData(img, 0, 0);
}
