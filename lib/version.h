/* The version every tether program reports (tether --version). */
#ifndef TT_VERSION_H
#define TT_VERSION_H

#define TETHER_VERSION "0.1.0"

#endif
