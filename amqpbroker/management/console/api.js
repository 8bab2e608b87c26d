// The management API, as the console uses it. Every POST carries the CSRF header the
// broker requires (X-Requested-By); credentials are the browser's basic-auth ones.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.headers["X-Requested-By"] = "amqpbroker-console";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message = data && typeof data.error === "string" ? data.error : response.statusText;
    throw new ApiError(response.status, `${message} (HTTP ${response.status})`);
  }
  return { data, headers: response.headers };
}

export const q = (name) => encodeURIComponent(name);

export async function get(path) {
  return (await call("GET", path)).data;
}

export async function getWithHeaders(path) {
  return call("GET", path);
}

export async function post(path, body = {}) {
  return (await call("POST", path, body)).data;
}
