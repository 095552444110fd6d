package io.mqbalance.rocketmq;

/** A sidecar request failed: {@link #status()} is the HTTP status, or 0 when the sidecar was unreachable. */
public class SidecarException extends Exception {
    private static final long serialVersionUID = 1L;
    private final int status;
    private final String error;

    public SidecarException(int status, String message, Throwable cause) {
        this(status, message, null, cause);
    }

    /** {@code error}: the {@code error} of the sidecar's JSON answer, null when it gave none. */
    public SidecarException(int status, String message, String error, Throwable cause) {
        super(message, cause);
        this.status = status;
        this.error = error;
    }

    public int status() {
        return status;
    }

    /** The sidecar's own explanation (the JSON answer's {@code error}), or null when it gave none. */
    public String error() {
        return error;
    }
}
